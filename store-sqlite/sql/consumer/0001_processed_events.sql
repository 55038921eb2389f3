-- watukuy idempotent consumer (SQLite), migration 1: the processed-events table.
--
-- One row per event a projection applied, inserted in the same transaction as the projection's
-- writes (see ProcessedEvents::apply_once): the row exists if and only if the projection
-- committed. {table} is a validated identifier. Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS {table} (
    event_id    TEXT    PRIMARY KEY NOT NULL,
    poller      TEXT    NOT NULL,
    "partition" TEXT    NOT NULL,
    lane        TEXT    NOT NULL,
    "type"      TEXT    NOT NULL,
    applied_at  INTEGER NOT NULL
);

-- TTL pruning deletes by age.
CREATE INDEX IF NOT EXISTS {table}_applied_idx ON {table} (applied_at);
