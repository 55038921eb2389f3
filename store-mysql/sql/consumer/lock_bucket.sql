-- claim, step 1: locks the bucket row of the event's subject (CRC32 of poller, partition and
-- subject, modulo the 4096 rows of 0003_claim_lock_rows.sql) until the transaction ends.
--
-- Claims of one subject, and so of one event id, run one after the other: a claim that meets a
-- concurrent, uncommitted claim waits here until that transaction ends, then finds what it
-- committed (or nothing, after a rollback). The row always exists, so this is a record lock on
-- an equality match of the primary key at any isolation level (no gap lock), and a rollback
-- removes nothing another claim waits on. Subjects sharing a bucket wait for each other too
-- (one in 4096 pairs), never longer than a transaction. No row means the table was not
-- migrated to version 3.
-- ?: poller, partition, subject.
SELECT bucket FROM `{table}_locks`
WHERE bucket = CRC32(CONCAT_WS(0x00, ?, ?, ?)) % 4096
FOR UPDATE
