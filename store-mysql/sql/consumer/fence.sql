-- check_fence: whether the engine store's key is still leased to the fence's owner with its
-- epoch, read in the projection's transaction just before its commit. A locking read in share
-- mode (`LOCK IN SHARE MODE`: MariaDB has no `FOR SHARE`, MySQL 8 keeps the old spelling): it
-- reads the newest committed row whatever the isolation level, and a takeover, which locks the
-- row for update, waits for this transaction to end, so it is ordered after this commit. {keys}
-- is the engine store's key table (`<prefix>keys`) in this database.
-- ?: poller, partition, owner, epoch.
SELECT 1 FROM {keys}
WHERE poller = ? AND part = ? AND holder = ? AND epoch = ?
LOCK IN SHARE MODE
