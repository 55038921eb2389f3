-- watukuy PostgreSQL store: which migrations ran for this schema and table prefix. Created on
-- every migrate() before any versioned migration (sql/NNNN_*.sql) runs.
CREATE TABLE IF NOT EXISTS "{schema}"."{prefix}schema_version" (
    version integer PRIMARY KEY,
    name    text NOT NULL
)
