-- prune, second statement: the markers applied before the cut; its affected rows are what
-- prune returns.
-- ?: cut (epoch ms).
DELETE FROM `{table}` WHERE applied_at < ?
