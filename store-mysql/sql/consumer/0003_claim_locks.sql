-- watukuy idempotent consumer (MySQL / MariaDB), migration 3: the claim locks.
--
-- 4096 rows that never change, one per bucket of subjects (see lock_bucket.sql). Every claim
-- locks its subject's bucket row first, so claims of one subject (and so of one event id) queue
-- on a row that always exists. Queuing on the insert of a new row instead (a marker, a
-- subject's first record) deadlocks in InnoDB: when the inserting transaction rolls back, the
-- locks its waiters asked for on the vanished row turn into gap locks, and two waiters then
-- block each other's inserts. {table} is a validated identifier, always back-quoted here.
-- Idempotent (IF NOT EXISTS); 0003_claim_lock_rows.sql fills it.
CREATE TABLE IF NOT EXISTS `{table}_locks` (
    bucket SMALLINT UNSIGNED NOT NULL PRIMARY KEY
) ENGINE=InnoDB
