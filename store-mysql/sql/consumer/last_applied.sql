-- claim, step 3 (only when the marker existed): the subject's last applied event (id, type,
-- sequence). A locking read: InnoDB reads the newest committed version of the row (the one a
-- concurrent claim, which this claim waited for in step 1, committed), not the transaction's
-- REPEATABLE READ snapshot, which may predate that commit. No row: the subject has no record
-- (pruned apart from the marker), and the event is a duplicate.
-- ?: poller, partition, subject.
SELECT event_id, `type`, `sequence` FROM `{table}_subjects`
WHERE poller = ? AND `partition` = ? AND subject = ?
FOR UPDATE
