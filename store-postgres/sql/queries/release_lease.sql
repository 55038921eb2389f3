-- release_lease: clears the holder while owner and epoch still match; the epoch counter stays.
-- $1 poller, $2 partition, $3 owner, $4 epoch.
UPDATE {pollers}
SET lease_owner = NULL, lease_expires_at = NULL
WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
