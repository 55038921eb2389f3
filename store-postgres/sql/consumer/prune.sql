-- Deletes markers applied before $1 (epoch ms); returns how many through the command tag.
DELETE FROM "{schema}"."{table}" WHERE applied_at < $1
