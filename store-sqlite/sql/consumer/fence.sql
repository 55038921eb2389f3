-- check_fence: whether the engine store's key is still leased to ?3 with epoch ?4, read in the
-- projection's transaction just before its commit. That transaction is immediate: it holds the
-- file's write lock from its start, so a takeover (a write to the same table) cannot commit
-- between this read and the commit; it waits for the transaction to end. {pollers} is the engine
-- store's table in this file (its table prefix + `pollers`).
-- ?1 poller, ?2 partition, ?3 owner, ?4 epoch.
SELECT EXISTS (
    SELECT 1 FROM {pollers}
    WHERE poller = ?1 AND "partition" = ?2 AND lease_owner = ?3 AND lease_epoch = ?4
)
