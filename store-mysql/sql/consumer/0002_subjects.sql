-- watukuy idempotent consumer (MySQL / MariaDB), migration 2: the last event applied per subject.
--
-- An event id can come back as a new change: a delete and a re-create with the same content
-- give the re-create the original `created` id (ids are identity + version-or-hash + type), and
-- an item that changes back to an earlier content gets that content's `updated` id again.
-- ProcessedEvents::claim reads the subject's last applied event (its id, type and sequence) to
-- tell such a change from a redelivery. One row per (poller, partition, subject), written in
-- the same transaction as the marker. {table} is a validated identifier, always back-quoted
-- here. Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS `{table}_subjects` (
    poller      VARBINARY(255) NOT NULL,
    `partition` VARBINARY(255) NOT NULL,
    subject     VARBINARY(1024) NOT NULL,
    event_id    VARBINARY(255) NOT NULL,
    `type`      VARBINARY(16) NOT NULL,
    applied_at  BIGINT NOT NULL,
    `sequence`  BIGINT NOT NULL,
    PRIMARY KEY (poller, `partition`, subject),
    -- TTL pruning deletes by age, with the markers.
    KEY applied (applied_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC
