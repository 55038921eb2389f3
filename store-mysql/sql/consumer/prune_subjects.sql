-- prune, first statement: the subjects' last applied events recorded before the cut. A subject
-- whose last event is older than the cut has an older marker too (both are stamped together),
-- which prune_markers.sql deletes in the same transaction.
-- ?: cut (epoch ms).
DELETE FROM `{table}_subjects` WHERE applied_at < ?
