-- acquire_lease: ONE upsert. A new key starts at epoch 1; an existing one is taken when it is
-- unowned, expired (expires_at <= now) or held by the same owner, always with the next value of
-- the never-reset epoch counter. No row back means another owner holds a valid lease.
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
RETURNING lease_epoch, lease_expires_at
