-- Deletes markers (and subjects' last events) applied before $1 (epoch ms); returns how many
-- markers.
WITH subjects AS (
    DELETE FROM "{schema}"."{table}_subjects" WHERE applied_at < $1
), markers AS (
    DELETE FROM "{schema}"."{table}" WHERE applied_at < $1 RETURNING 1
)
SELECT count(*) FROM markers
