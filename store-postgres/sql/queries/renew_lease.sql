-- renew_lease: moves the expiry only while owner and epoch still match (one statement).
-- $1 poller, $2 partition, $3 owner, $4 epoch, $5 new expiry.
UPDATE {pollers}
SET lease_expires_at = $5
WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
