-- Locks a key's row (if any) for the rest of the transaction, waiting for fenced writes in
-- flight. $1 poller, $2 partition.
SELECT 1 FROM {pollers} WHERE poller = $1 AND "partition" = $2 FOR UPDATE
