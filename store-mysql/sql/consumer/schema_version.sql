-- watukuy idempotent consumer (MySQL / MariaDB): which consumer migrations ran for this table.
-- {table} is a validated identifier, always back-quoted here. Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS `{table}_version` (
    version INT NOT NULL PRIMARY KEY,
    name    VARCHAR(64) NOT NULL
) ENGINE=InnoDB
