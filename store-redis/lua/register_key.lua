-- Lists a key for list_keys. Both sets share the `{keys}` hash tag (one cluster slot), so the
-- two additions are atomic with respect to unregister_key.lua.
-- KEYS: pollers set, partitions set of this poller. ARGV: poller, partition.
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 'OK'
