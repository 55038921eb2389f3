-- watukuy idempotent consumer (SQLite), migration 3: the sequence of each subject's last applied
-- event.
--
-- A delivery of an id that has a marker, older (by sequence) than the event its subject last
-- applied, is a late redelivery (an instance frozen past its lease waking up), never a new
-- change: a new change of a subject always comes with a higher sequence. NULL for rows written
-- before this migration. {table} is a validated identifier.
--
-- SQLite has no ADD COLUMN IF NOT EXISTS, and this text must stay idempotent (ProcessedEvents::ddl
-- runs every migration each time it is run). So the last applied events move to a new table,
-- {table}_last, which has the column: it is created when missing, takes the rows of
-- {table}_subjects that it does not have yet (with a NULL sequence), and {table}_subjects is
-- dropped. Run again, after migration 2 created an empty {table}_subjects, it copies nothing and
-- drops that table again. A process still running code that knows only version 2 then fails on
-- the missing {table}_subjects instead of writing last events without their sequence: upgrade
-- every process sharing the file together.
CREATE TABLE IF NOT EXISTS {table}_last (
    poller      TEXT    NOT NULL,
    "partition" TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    "type"      TEXT    NOT NULL,
    applied_at  INTEGER NOT NULL,
    sequence    INTEGER,
    PRIMARY KEY (poller, "partition", subject)
);

-- TTL pruning deletes by age, with the markers.
CREATE INDEX IF NOT EXISTS {table}_last_applied_idx ON {table}_last (applied_at);

INSERT OR IGNORE INTO {table}_last
    (poller, "partition", subject, event_id, "type", applied_at, sequence)
SELECT poller, "partition", subject, event_id, "type", applied_at, NULL
FROM {table}_subjects;

DROP TABLE IF EXISTS {table}_subjects;
