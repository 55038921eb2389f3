-- save_state_unfenced: one upsert that never touches the lease columns. The row lock taken by
-- the upsert serialises it with fenced writes of the same key.
-- $1 poller, $2 partition, $3..$15 the state parameters (see save_state.sql).
INSERT INTO {pollers} AS p
    (poller, "partition", listed, has_state, lanes, schedule, paused, schema_version, sequence,
     created_at, updated_at)
VALUES ($1, $2, true, true, $3::json, $4::json, $5, $6, $7, $8, $9)
ON CONFLICT (poller, "partition") DO UPDATE SET
    listed = true,
{state_assignments}
