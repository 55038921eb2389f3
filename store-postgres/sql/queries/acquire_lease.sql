-- acquire_lease (and claim): ONE upsert. A new key starts at epoch 1; an existing one is taken
-- when it is unowned, expired (expires_at <= now) or held by the same owner, always with the
-- next value of the never-reset epoch counter. No row back means another owner holds a valid
-- lease.
--
-- The row back also carries the key's state, for claim: it is the row as this statement wrote
-- it, after waiting for the row lock any fenced write in flight holds (every fenced write
-- locks this row), so it includes the superseded holder's last write. The outbox is read by a
-- second statement (has_pending.sql) on purpose: a subquery here would read with this
-- statement's snapshot, taken before the wait, and could miss the rows that write committed.
-- $1 poller, $2 partition, $3 owner, $4 now_ms, $5 now_ms + ttl_ms.
INSERT INTO {pollers} AS p
    (poller, "partition", listed, lease_owner, lease_epoch, lease_expires_at, epoch_counter)
VALUES ($1, $2, true, $3, 1, $5, 1)
ON CONFLICT (poller, "partition") DO UPDATE SET
    listed = true,
    lease_owner = EXCLUDED.lease_owner,
    epoch_counter = p.epoch_counter + 1,
    lease_epoch = p.epoch_counter + 1,
    lease_expires_at = EXCLUDED.lease_expires_at
WHERE p.lease_owner IS NULL
   OR p.lease_expires_at IS NULL
   OR p.lease_expires_at <= $4
   OR p.lease_owner = EXCLUDED.lease_owner
RETURNING lease_epoch, lease_expires_at, has_state, lanes::text AS lanes,
          schedule::text AS schedule, paused, schema_version, sequence, created_at, updated_at
