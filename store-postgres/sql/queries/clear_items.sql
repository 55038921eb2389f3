-- clear_items: the snapshot only. $1 poller, $2 partition.
DELETE FROM {items} WHERE poller = $1 AND "partition" = $2
