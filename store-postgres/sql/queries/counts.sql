-- counts: items, pending outbox rows and parked rows of one key, one round trip. $1 poller,
-- $2 partition. The pending count uses the partial index outbox_queue_idx (its predicate is the
-- literal `status = 'pending'`).
SELECT
    (SELECT count(*) FROM {items} WHERE poller = $1 AND "partition" = $2),
    (SELECT count(*) FROM {outbox} WHERE poller = $1 AND "partition" = $2 AND status = 'pending'),
    (SELECT count(*) FROM {parked} WHERE poller = $1 AND "partition" = $2)
