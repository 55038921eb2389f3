-- claim, step 2: inserts the event's marker. It fails with ER_DUP_ENTRY (1062) when the id has
-- a marker, and only then (the table has no other unique key): claim reads that error as
-- "already recorded" and decides with last_applied.sql. Every other error (a value too long, a
-- missing table) stays an error. Not `INSERT IGNORE`, which would turn those into warnings as
-- well, and not `INSERT … ON DUPLICATE KEY UPDATE event_id = event_id`, whose affected-rows
-- count cannot tell an insert from a duplicate on a connection with CLIENT_FOUND_ROWS (sqlx
-- always asks for it): both report 1. The failed statement alone is rolled back; the
-- transaction goes on, holding a shared lock on the existing marker (no other claim of the id
-- can hold one: they wait in step 1).
-- ?: event id, poller, partition, lane, type, applied_at (epoch ms).
INSERT INTO `{table}` (event_id, poller, `partition`, lane, `type`, applied_at)
VALUES (?, ?, ?, ?, ?, ?)
