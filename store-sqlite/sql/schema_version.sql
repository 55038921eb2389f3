-- The schema version of one table prefix: one row per applied migration. Several prefixes may
-- share one database file, so the version lives in a prefixed table, not in PRAGMA user_version.
CREATE TABLE IF NOT EXISTS {prefix}schema_version (
    version INTEGER PRIMARY KEY NOT NULL
);
