-- apply_once, fenced: whether the engine store's key is still leased to $3 with epoch $4, read
-- in the projection's transaction just before its commit. A takeover that commits after this
-- read is ordered after this transaction: the new holder's claim of any id this transaction
-- claimed waits for it on the marker. {pollers} is the engine store's table in this database.
-- $1 poller, $2 partition, $3 owner, $4 epoch.
SELECT EXISTS (
    SELECT 1 FROM {pollers}
    WHERE poller = $1 AND "partition" = $2 AND lease_owner = $3 AND lease_epoch = $4
)
