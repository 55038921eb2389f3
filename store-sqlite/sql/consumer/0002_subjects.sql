-- watukuy idempotent consumer (SQLite), migration 2: the last event applied per subject.
--
-- An event id can come back as a new change: a delete and a re-create with the same content
-- give the re-create the original `created` id (ids are identity + version-or-hash + type), and
-- an item that changes back to an earlier content gets that content's `updated` id again.
-- ProcessedEvents::claim reads the subject's last applied event to tell such a change from a
-- redelivery. One row per (poller, partition, subject), written in the same transaction as the
-- marker. {table} is a validated identifier. Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS {table}_subjects (
    poller      TEXT    NOT NULL,
    "partition" TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    "type"      TEXT    NOT NULL,
    applied_at  INTEGER NOT NULL,
    PRIMARY KEY (poller, "partition", subject)
);

-- TTL pruning deletes by age, with the markers.
CREATE INDEX IF NOT EXISTS {table}_subjects_applied_idx ON {table}_subjects (applied_at);
