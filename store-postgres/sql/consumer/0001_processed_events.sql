-- watukuy idempotent consumer (PostgreSQL), migration 1: the processed-events table.
--
-- One row per event a projection applied, inserted in the same transaction as the projection's
-- writes (see ProcessedEvents::apply_once): the row exists if and only if the projection
-- committed. {schema} and {table} are validated identifiers, always double-quoted here.
-- Idempotent (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    event_id    text COLLATE "C" PRIMARY KEY,
    poller      text NOT NULL,
    "partition" text NOT NULL,
    lane        text NOT NULL,
    "type"      text NOT NULL,
    applied_at  bigint NOT NULL
);

-- TTL pruning deletes by age.
CREATE INDEX IF NOT EXISTS "{table}_applied_idx" ON "{schema}"."{table}" (applied_at);
