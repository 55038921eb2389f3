-- apply_once: claims an event id inside the caller's transaction. Inserts the marker, or does
-- nothing when the id is already there (a concurrent insert of the same id waits for the other
-- transaction: it then either finds the committed marker or inserts after a rollback), and, when
-- inserted, makes it its subject's last applied event. Returns whether it inserted. Nothing of
-- what another transaction committed during the wait is read here: this statement's snapshot
-- predates it, so a marker that was found is judged by recheck.sql, a statement of its own.
-- $1 event id, $2 poller, $3 partition, $4 lane, $5 type, $6 applied_at (epoch ms), $7 subject,
-- $8 sequence.
WITH fresh AS (
    INSERT INTO "{schema}"."{table}" (event_id, poller, "partition", lane, "type", applied_at)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING 1
), subject AS (
    INSERT INTO "{schema}"."{table}_subjects" AS s
        (poller, "partition", subject, event_id, "type", applied_at, sequence)
    SELECT $2, $3, $7, $1, $5, $6, $8 FROM fresh
    ON CONFLICT (poller, "partition", subject) DO UPDATE SET
        event_id = EXCLUDED.event_id,
        "type" = EXCLUDED."type",
        applied_at = EXCLUDED.applied_at,
        sequence = EXCLUDED.sequence
)
SELECT EXISTS (SELECT 1 FROM fresh) AS inserted
