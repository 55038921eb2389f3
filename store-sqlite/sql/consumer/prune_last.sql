-- prune, first: the subjects' last events applied before ?1 (epoch ms). A subject without one
-- treats a redelivery of a marked id as a duplicate, which is what it is once its markers are
-- old enough to prune.
DELETE FROM {table}_last WHERE applied_at < ?1
