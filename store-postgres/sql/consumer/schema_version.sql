-- watukuy idempotent consumer (PostgreSQL): which consumer migrations ran for this table.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_version" (
    version integer PRIMARY KEY,
    name    text NOT NULL
)
