-- claim: an id with a marker came back as a new change: its marker is stamped again (set_last.sql
-- then makes it its subject's last applied event).
-- ?1 event id, ?2 lane, ?3 type, ?4 applied_at (epoch ms).
UPDATE {table} SET lane = ?2, "type" = ?3, applied_at = ?4 WHERE event_id = ?1
