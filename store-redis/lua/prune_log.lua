-- Deletes log entries created strictly before a time; returns how many.
-- KEYS: log, log rows, log times. ARGV: '(<older_than>'.
local wrong = check_types(KEYS, 'zset', 'hash', 'zset')
if wrong then return wrong end
local sequences = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
for _, sequence in ipairs(sequences) do
  redis.call('ZREM', KEYS[1], sequence)
  redis.call('HDEL', KEYS[2], sequence)
  redis.call('ZREM', KEYS[3], sequence)
end
return #sequences
