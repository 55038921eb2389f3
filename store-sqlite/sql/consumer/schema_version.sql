-- watukuy idempotent consumer (SQLite): which consumer migrations ran for this table.
CREATE TABLE IF NOT EXISTS {table}_version (
    version INTEGER PRIMARY KEY NOT NULL
);
