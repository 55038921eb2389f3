-- apply_once: an id with a marker came back as a new change (see watukuy_core::delivery::
-- reapplies): the marker is stamped again and the event becomes its subject's last applied one.
-- $1 event id, $2 poller, $3 partition, $4 lane, $5 type, $6 applied_at (epoch ms), $7 subject,
-- $8 sequence.
WITH marker AS (
    UPDATE "{schema}"."{table}" SET lane = $4, "type" = $5, applied_at = $6 WHERE event_id = $1
)
INSERT INTO "{schema}"."{table}_subjects" AS s
    (poller, "partition", subject, event_id, "type", applied_at, sequence)
VALUES ($2, $3, $7, $1, $5, $6, $8)
ON CONFLICT (poller, "partition", subject) DO UPDATE SET
    event_id = EXCLUDED.event_id,
    "type" = EXCLUDED."type",
    applied_at = EXCLUDED.applied_at,
    sequence = EXCLUDED.sequence
