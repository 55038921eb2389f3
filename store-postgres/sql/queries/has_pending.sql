-- has_pending: whether the key's outbox holds a pending row (one probe of the partial index
-- outbox_queue_idx). $1 poller, $2 partition.
SELECT EXISTS (
    SELECT 1 FROM {outbox} WHERE poller = $1 AND "partition" = $2 AND status = 'pending'
) AS pending
