-- Unlists a key; the poller leaves the pollers set with its last partition.
-- KEYS: pollers set, partitions set of this poller. ARGV: poller, partition.
redis.call('SREM', KEYS[2], ARGV[2])
if redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[1], ARGV[1])
end
return 'OK'
