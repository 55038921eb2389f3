-- prune, second: the markers applied before ?1 (epoch ms); their count is what prune returns.
DELETE FROM {table} WHERE applied_at < ?1
