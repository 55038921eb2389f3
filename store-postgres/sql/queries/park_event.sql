-- park_event: fenced, ONE statement (fence as in ack_events.sql): removes the outbox row of the
-- row's event (none when $5 is NULL) and inserts or replaces the parked row.
-- $1 poller, $2 partition, $3 owner, $4 epoch, $5 the event's id or NULL, $6 id, $7 kind,
-- $8 event, $9 event_seq, $10 item, $11 error, $12 attempts, $13 parked_at, $14 hold_key.
WITH fence AS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
    FOR UPDATE
), gone AS (
    DELETE FROM {outbox}
    WHERE poller = $1 AND "partition" = $2 AND event_id = $5
      AND EXISTS (SELECT 1 FROM fence)
), put AS (
    INSERT INTO {parked}
        (poller, "partition", id, kind, event, event_seq, item, error, attempts, parked_at,
         hold_key)
    SELECT $1, $2, $6, $7, $8::json, $9, $10::json, $11::json, $12, $13, $14
    WHERE EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (poller, "partition", id) DO UPDATE SET
        kind = EXCLUDED.kind,
        event = EXCLUDED.event,
        event_seq = EXCLUDED.event_seq,
        item = EXCLUDED.item,
        error = EXCLUDED.error,
        attempts = EXCLUDED.attempts,
        parked_at = EXCLUDED.parked_at,
        hold_key = EXCLUDED.hold_key
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
