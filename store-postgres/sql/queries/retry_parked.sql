-- retry_parked: ONE statement. Poison rows with an event leave the parked table (releasing their
-- hold) and come back as pending outbox rows { event_id: parked id, seq: the event's sequence,
-- attempts 0, no error, no next attempt, created_at: parked_at }. Returns how many moved.
-- $1 poller, $2 partition, $3 ids.
WITH moved AS (
    DELETE FROM {parked}
    WHERE poller = $1 AND "partition" = $2 AND id = ANY($3::text[])
      AND kind = 'poison' AND event IS NOT NULL AND event_seq IS NOT NULL
    RETURNING id, event, event_seq, parked_at
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
