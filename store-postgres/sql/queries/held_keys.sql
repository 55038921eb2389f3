-- held_keys: distinct non-null hold keys. $1 poller, $2 partition. Read in order from the
-- partial index parked_hold_idx, which holds only parked rows with a hold key.
SELECT DISTINCT hold_key
FROM {parked}
WHERE poller = $1 AND "partition" = $2 AND hold_key IS NOT NULL
ORDER BY hold_key
