-- count_pending. $1 poller, $2 partition.
SELECT count(*) FROM {outbox} WHERE poller = $1 AND "partition" = $2 AND status = 'pending'
