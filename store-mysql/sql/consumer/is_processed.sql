-- Whether a marker exists for the event id.
-- ?: event id.
SELECT 1 FROM `{table}` WHERE event_id = ?
