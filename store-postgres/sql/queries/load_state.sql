-- load_state: the state's columns, only once a state was saved. $1 poller, $2 partition.
SELECT lanes::text AS lanes, schedule::text AS schedule, paused, schema_version, sequence,
       created_at, updated_at
FROM {pollers}
WHERE poller = $1 AND "partition" = $2 AND has_state
