-- load_pending: sequence order (ties by event id, byte order), not filtered by
-- next_attempt_at. $1 poller, $2 partition, $3 limit. Read in order from the partial index
-- outbox_queue_idx (its predicate is the literal `status = 'pending'` below), stopping after
-- $3 entries.
SELECT event_id, seq, event::text AS event, attempts, next_attempt_at,
       last_error::text AS last_error, created_at
FROM {outbox}
WHERE poller = $1 AND "partition" = $2 AND status = 'pending'
ORDER BY seq, event_id
LIMIT $3
