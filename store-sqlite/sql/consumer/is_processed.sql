-- Whether a marker exists for ?1.
SELECT EXISTS (SELECT 1 FROM {table} WHERE event_id = ?1)
