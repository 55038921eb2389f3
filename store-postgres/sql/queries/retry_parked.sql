-- retry_parked: ONE statement. Poison rows with an event leave the parked table (releasing their
-- hold) and come back as pending outbox rows { event_id: parked id, seq: the event's sequence,
-- attempts 0, no error, no next attempt, created_at: parked_at }. Returns how many moved.
-- The ids are joined on the whole primary key (see ack_events.sql).
-- $1 poller, $2 partition, $3 ids.
WITH ids AS MATERIALIZED (
    SELECT $1::text COLLATE "C" AS poller, $2::text COLLATE "C" AS "partition",
           u.id COLLATE "C" AS id
    FROM unnest($3::text[]) AS u (id)
), moved AS (
    DELETE FROM {parked} AS p
    USING ids
    WHERE p.poller = ids.poller AND p."partition" = ids."partition" AND p.id = ids.id
      AND p.kind = 'poison' AND p.event IS NOT NULL AND p.event_seq IS NOT NULL
    RETURNING p.id, p.event, p.event_seq, p.parked_at
), put AS (
    INSERT INTO {outbox}
        (poller, "partition", event_id, seq, event, status, attempts, next_attempt_at,
         last_error, created_at)
    SELECT $1, $2, m.id, m.event_seq, m.event, 'pending', 0, NULL, NULL, m.parked_at
    FROM moved AS m
    ON CONFLICT (poller, "partition", event_id) DO UPDATE SET
        seq = EXCLUDED.seq,
        event = EXCLUDED.event,
        status = EXCLUDED.status,
        attempts = EXCLUDED.attempts,
        next_attempt_at = EXCLUDED.next_attempt_at,
        last_error = EXCLUDED.last_error,
        created_at = EXCLUDED.created_at
)
SELECT count(*) FROM moved
