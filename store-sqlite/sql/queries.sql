-- Every statement of the store. Each starts at a `-- name: <name>` line; `{prefix}` is the
-- validated table prefix and `{ids}` (in the chunked statements) a list of `?` placeholders.
-- ?1 and ?2 are always the key's poller and partition.

-- name: schema_current
SELECT COALESCE(MAX(version), 0) FROM {prefix}schema_version;

-- name: schema_record
INSERT OR IGNORE INTO {prefix}schema_version (version) VALUES (?1);

-- name: lease_acquire
-- One upsert: a new key starts at epoch 1; an existing key is taken when it is unowned, expired
-- (expires_at <= now) or held by the same owner, and its counter moves on (never reset). The
-- right-hand sides of SET read the row's old values. No row comes back when the lease is held.
INSERT INTO {prefix}pollers
    (poller, "partition", present, lease_owner, lease_epoch, lease_expires_at, epoch_counter)
VALUES (?1, ?2, 1, ?3, 1, ?4, 1)
ON CONFLICT (poller, "partition") DO UPDATE SET
    present = 1,
    lease_owner = excluded.lease_owner,
    lease_epoch = epoch_counter + 1,
    lease_expires_at = excluded.lease_expires_at,
    epoch_counter = epoch_counter + 1
WHERE lease_owner IS NULL OR lease_expires_at <= ?5 OR lease_owner = excluded.lease_owner
RETURNING lease_owner, lease_epoch, lease_expires_at;

-- name: lease_renew
UPDATE {prefix}pollers SET lease_expires_at = ?5
WHERE poller = ?1 AND "partition" = ?2 AND lease_owner = ?3 AND lease_epoch = ?4;

-- name: lease_release
UPDATE {prefix}pollers SET lease_owner = NULL, lease_expires_at = NULL
WHERE poller = ?1 AND "partition" = ?2 AND lease_owner = ?3 AND lease_epoch = ?4;

-- name: lease_get
SELECT lease_owner, lease_epoch, lease_expires_at FROM {prefix}pollers
WHERE poller = ?1 AND "partition" = ?2 AND lease_owner IS NOT NULL;

-- name: lease_holder
-- The fence: read inside the write transaction, before anything is written.
SELECT lease_owner, lease_epoch FROM {prefix}pollers
WHERE poller = ?1 AND "partition" = ?2;

-- name: state_get
SELECT state FROM {prefix}pollers WHERE poller = ?1 AND "partition" = ?2;

-- name: state_set
UPDATE {prefix}pollers SET state = ?3 WHERE poller = ?1 AND "partition" = ?2;

-- name: state_upsert
-- Unfenced saves: create the key if needed, never touch the lease columns.
INSERT INTO {prefix}pollers (poller, "partition", present, state) VALUES (?1, ?2, 1, ?3)
ON CONFLICT (poller, "partition") DO UPDATE SET present = 1, state = excluded.state;

-- name: keys_list
SELECT poller, "partition" FROM {prefix}pollers
WHERE present = 1 AND (?1 IS NULL OR poller = ?1)
ORDER BY poller, "partition";

-- name: key_forget
-- delete_key keeps the row for its epoch counter only.
UPDATE {prefix}pollers
SET present = 0, state = NULL, lease_owner = NULL, lease_epoch = 0, lease_expires_at = NULL
WHERE poller = ?1 AND "partition" = ?2;

-- name: items_clear
DELETE FROM {prefix}items WHERE poller = ?1 AND "partition" = ?2;

-- name: items_upsert
INSERT OR REPLACE INTO {prefix}items
    (poller, "partition", identity, version, hash, schema_version, payload, seen_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);

-- name: items_delete_in
DELETE FROM {prefix}items WHERE poller = ?1 AND "partition" = ?2 AND identity IN ({ids});

-- name: items_load_in
SELECT identity, version, hash, schema_version, payload, seen_at FROM {prefix}items
WHERE poller = ?1 AND "partition" = ?2 AND identity IN ({ids});

-- name: items_first_page
-- The Store contract's byte order (stream_identities point 2): identity has SQLite's default
-- BINARY collation, memcmp over the text's UTF-8 bytes (the store creates its files UTF-8).
SELECT identity FROM {prefix}items WHERE poller = ?1 AND "partition" = ?2
ORDER BY identity LIMIT ?3;

-- name: items_next_page
-- Keyset pagination on the primary key: stable under concurrent writes, no OFFSET scans.
SELECT identity FROM {prefix}items WHERE poller = ?1 AND "partition" = ?2 AND identity > ?3
ORDER BY identity LIMIT ?4;

-- name: key_counts
SELECT (SELECT COUNT(*) FROM {prefix}items WHERE poller = ?1 AND "partition" = ?2),
       (SELECT COUNT(*) FROM {prefix}outbox WHERE poller = ?1 AND "partition" = ?2),
       (SELECT COUNT(*) FROM {prefix}parked WHERE poller = ?1 AND "partition" = ?2);

-- name: outbox_clear
DELETE FROM {prefix}outbox WHERE poller = ?1 AND "partition" = ?2;

-- name: outbox_upsert
INSERT OR REPLACE INTO {prefix}outbox
    (poller, "partition", event_id, seq, event, attempts, next_attempt_at, last_error, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9);

-- name: outbox_delete
DELETE FROM {prefix}outbox WHERE poller = ?1 AND "partition" = ?2 AND event_id = ?3;

-- name: outbox_pending
SELECT event_id, seq, event, attempts, next_attempt_at, last_error, created_at
FROM {prefix}outbox WHERE poller = ?1 AND "partition" = ?2
ORDER BY seq, event_id LIMIT ?3;

-- name: outbox_attempt
UPDATE {prefix}outbox
SET attempts = MIN(attempts + 1, 4294967295), last_error = ?4, next_attempt_at = ?5
WHERE poller = ?1 AND "partition" = ?2 AND event_id = ?3;

-- name: parked_clear
DELETE FROM {prefix}parked WHERE poller = ?1 AND "partition" = ?2;

-- name: parked_upsert
INSERT OR REPLACE INTO {prefix}parked
    (poller, "partition", id, kind, event, item, error, attempts, parked_at, hold_key)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10);

-- name: parked_list
SELECT id, kind, event, item, error, attempts, parked_at, hold_key FROM {prefix}parked
WHERE poller = ?1 AND "partition" = ?2 AND (?3 IS NULL OR kind = ?3)
ORDER BY parked_at, id LIMIT ?4;

-- name: parked_held
SELECT DISTINCT hold_key FROM {prefix}parked
WHERE poller = ?1 AND "partition" = ?2 AND hold_key IS NOT NULL
ORDER BY hold_key;

-- name: parked_retryable_in
SELECT id, event, parked_at FROM {prefix}parked
WHERE poller = ?1 AND "partition" = ?2 AND kind = 'poison' AND event IS NOT NULL
    AND id IN ({ids});

-- name: parked_delete
DELETE FROM {prefix}parked WHERE poller = ?1 AND "partition" = ?2 AND id = ?3;

-- name: parked_delete_in
DELETE FROM {prefix}parked WHERE poller = ?1 AND "partition" = ?2 AND id IN ({ids});

-- name: validators_clear
DELETE FROM {prefix}validators WHERE poller = ?1 AND "partition" = ?2;

-- name: validator_get
SELECT etag, last_modified, stored_at FROM {prefix}validators
WHERE poller = ?1 AND "partition" = ?2 AND url_hash = ?3;

-- name: validator_set
INSERT OR REPLACE INTO {prefix}validators
    (poller, "partition", url_hash, etag, last_modified, stored_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6);

-- name: log_clear
DELETE FROM {prefix}log WHERE poller = ?1 AND "partition" = ?2;

-- name: log_upsert
INSERT OR REPLACE INTO {prefix}log (poller, "partition", seq, event, created_at)
VALUES (?1, ?2, ?3, ?4, ?5);

-- name: log_read
SELECT seq, event, created_at FROM {prefix}log
WHERE poller = ?1 AND "partition" = ?2
    AND (?3 IS NULL OR seq > ?3)
    AND (?4 IS NULL OR created_at >= ?4)
    AND (?5 IS NULL OR created_at <= ?5)
ORDER BY seq LIMIT ?6;

-- name: log_prune
DELETE FROM {prefix}log WHERE poller = ?1 AND "partition" = ?2 AND created_at < ?3;
