-- save_state: fenced, ONE statement. The UPDATE's WHERE is the fence: it locks the key's row and
-- re-checks owner and epoch on the latest row version before writing, so a write with a stale
-- lease touches nothing (0 rows: LeaseLost).
--
-- State parameters (shared with save_state_unfenced and commit_poll), see state_assignments.sql:
-- $3..$9 the full state a first save creates (PollerState::patched(None, patch): lanes,
-- schedule, paused, schema_version, sequence, created_at, updated_at); $10..$15 the patch's
-- fields, NULL where the patch leaves a field alone (lanes, schedule, paused, schema_version,
-- sequence, updated_at). A patch replaces top-level fields; created_at never changes.
-- $1 poller, $2 partition, $16 owner, $17 epoch.
UPDATE {pollers} AS p SET
{state_assignments}
WHERE p.poller = $1 AND p."partition" = $2 AND p.lease_owner = $16 AND p.lease_epoch = $17
