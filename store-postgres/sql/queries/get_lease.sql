-- get_lease: the current holder, expired or not. $1 poller, $2 partition.
SELECT lease_owner, lease_epoch, lease_expires_at
FROM {pollers}
WHERE poller = $1 AND "partition" = $2 AND lease_owner IS NOT NULL
