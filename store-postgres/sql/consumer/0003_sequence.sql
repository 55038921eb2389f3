-- watukuy idempotent consumer (PostgreSQL), migration 3: the sequence of each subject's last
-- applied event.
--
-- A delivery of an id that has a marker, older (by sequence) than the event its subject last
-- applied, is a late redelivery (an instance frozen past its lease waking up), never a new
-- change: a new change of a subject always comes with a higher sequence. NULL for rows written
-- before this migration. {schema} and {table} are validated identifiers, always double-quoted
-- here. Idempotent (IF NOT EXISTS).
ALTER TABLE "{schema}"."{table}_subjects" ADD COLUMN IF NOT EXISTS sequence bigint;
