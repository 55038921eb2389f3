-- claim, last step when the event is applied: it becomes its subject's last applied event (the
-- row is created or overwritten; only claims holding the subject's bucket lock write it).
-- ?: poller, partition, subject, event id, type, applied_at (epoch ms), sequence, then event
-- id, type, applied_at, sequence again for the update.
INSERT INTO `{table}_subjects`
    (poller, `partition`, subject, event_id, `type`, applied_at, `sequence`)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE event_id = ?, `type` = ?, applied_at = ?, `sequence` = ?
