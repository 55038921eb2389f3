-- held_keys: distinct non-null hold keys. $1 poller, $2 partition.
SELECT DISTINCT hold_key
FROM {parked}
WHERE poller = $1 AND "partition" = $2 AND hold_key IS NOT NULL
ORDER BY hold_key
