-- watukuy idempotent consumer (MySQL / MariaDB), migration 1: the processed-events table.
--
-- One row (a marker) per event a projection applied, inserted in the same transaction as the
-- projection's writes (see ProcessedEvents::apply_once): the row exists if and only if the
-- projection committed. Ids and keys are VARBINARY, compared byte for byte like the store's (no
-- collation, no trailing-space padding). MySQL has no transactional DDL: the statement is
-- idempotent (IF NOT EXISTS), so a migration cut short is finished by the next one. {table} is
-- a validated identifier, always back-quoted here.
CREATE TABLE IF NOT EXISTS `{table}` (
    event_id    VARBINARY(255) NOT NULL PRIMARY KEY,
    poller      VARBINARY(255) NOT NULL,
    `partition` VARBINARY(255) NOT NULL,
    lane        VARBINARY(16) NOT NULL,
    `type`      VARBINARY(16) NOT NULL,
    applied_at  BIGINT NOT NULL,
    -- TTL pruning deletes by age.
    KEY applied (applied_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC
