-- apply_once: claims an event id inside the caller's transaction. Inserts the marker, or does
-- nothing when the id is already there (a concurrent insert of the same id waits for the other
-- transaction: it then either finds the committed marker or inserts after a rollback). Returns
-- one row when inserted, none when deduplicated.
-- $1 event id, $2 poller, $3 partition, $4 lane, $5 type, $6 applied_at (epoch ms).
INSERT INTO "{schema}"."{table}" (event_id, poller, "partition", lane, "type", applied_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (event_id) DO NOTHING
RETURNING 1
