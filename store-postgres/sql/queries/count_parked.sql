-- count_parked: every kind. $1 poller, $2 partition.
SELECT count(*) FROM {parked} WHERE poller = $1 AND "partition" = $2
