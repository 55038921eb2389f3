-- claim: records an event id inside the caller's immediate transaction, or does nothing when the
-- id already has a marker. One row changed means a fresh claim. The transaction holds the file's
-- write lock from its start, so no other claim runs meanwhile: what is read next is what
-- committed.
-- ?1 event id, ?2 poller, ?3 partition, ?4 lane, ?5 type, ?6 applied_at (epoch ms).
INSERT INTO {table} (event_id, poller, "partition", lane, "type", applied_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (event_id) DO NOTHING
