-- count_pending. $1 poller, $2 partition. Counted on the partial index outbox_queue_idx (its
-- predicate is the literal `status = 'pending'` below).
SELECT count(*) FROM {outbox} WHERE poller = $1 AND "partition" = $2 AND status = 'pending'
