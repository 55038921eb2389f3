-- count_items. $1 poller, $2 partition.
SELECT count(*) FROM {items} WHERE poller = $1 AND "partition" = $2
