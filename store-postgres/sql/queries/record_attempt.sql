-- record_attempt: fenced, ONE statement (fence as in ack_events.sql). attempts saturates at the
-- largest u32. $1 poller, $2 partition, $3 owner, $4 epoch, $5 event id, $6 error (JSON),
-- $7 next attempt or NULL.
WITH fence AS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
    FOR UPDATE
), hit AS (
    UPDATE {outbox} SET
        attempts = LEAST(attempts + 1, 4294967295),
        last_error = $6::json,
        next_attempt_at = $7
    WHERE poller = $1 AND "partition" = $2 AND event_id = $5
      AND EXISTS (SELECT 1 FROM fence)
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced
