-- claim: the claimed event becomes its subject's last applied event, with its sequence.
-- ?1 poller, ?2 partition, ?3 subject, ?4 event id, ?5 type, ?6 applied_at (epoch ms),
-- ?7 sequence.
INSERT INTO {table}_last (poller, "partition", subject, event_id, "type", applied_at, sequence)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (poller, "partition", subject) DO UPDATE SET
    event_id = excluded.event_id,
    "type" = excluded."type",
    applied_at = excluded.applied_at,
    sequence = excluded.sequence
