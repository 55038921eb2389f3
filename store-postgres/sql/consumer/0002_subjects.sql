-- watukuy idempotent consumer (PostgreSQL), migration 2: the last event applied per subject.
--
-- An event id can come back as a new change: a delete and a re-create with the same content
-- give the re-create the original `created` id (ids are identity + version-or-hash + type), and
-- an item that changes back to an earlier content gets that content's `updated` id again.
-- ProcessedEvents::claim reads the subject's last applied event to tell such a change from a
-- redelivery. One row per (poller, partition, subject), written in the same transaction as the
-- marker. {schema} and {table} are validated identifiers, always double-quoted here.
-- Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_subjects" (
    poller      text NOT NULL,
    "partition" text NOT NULL,
    subject     text COLLATE "C" NOT NULL,
    event_id    text COLLATE "C" NOT NULL,
    "type"      text NOT NULL,
    applied_at  bigint NOT NULL,
    PRIMARY KEY (poller, "partition", subject)
);

-- TTL pruning deletes by age, with the markers.
CREATE INDEX IF NOT EXISTS "{table}_subj_at" ON "{schema}"."{table}_subjects" (applied_at);
