-- delete_key: everything of the key in one statement (run after lock_key in one transaction,
-- so its snapshot includes every fenced write that was in flight). The key's row stays, unlisted
-- and without state or lease, to keep the epoch counter.
-- $1 poller, $2 partition.
WITH gone_items AS (
    DELETE FROM {items} WHERE poller = $1 AND "partition" = $2
), gone_outbox AS (
    DELETE FROM {outbox} WHERE poller = $1 AND "partition" = $2
), gone_parked AS (
    DELETE FROM {parked} WHERE poller = $1 AND "partition" = $2
), gone_validators AS (
    DELETE FROM {validators} WHERE poller = $1 AND "partition" = $2
), gone_log AS (
    DELETE FROM {log} WHERE poller = $1 AND "partition" = $2
)
UPDATE {pollers} SET
    listed = false, has_state = false, lanes = NULL, schedule = NULL, paused = NULL,
    schema_version = NULL, sequence = NULL, created_at = NULL, updated_at = NULL,
    lease_owner = NULL, lease_epoch = 0, lease_expires_at = NULL
WHERE poller = $1 AND "partition" = $2
