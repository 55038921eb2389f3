-- Fenced: one more failed attempt of a pending row. The row's JSON is not decoded: attempts are
-- counted beside it and the last error (with the next attempt time) replaces the one beside it;
-- the store adds both to the row when it reads it. An unknown id is a no-op.
-- KEYS: meta, rows, attempts, errors. ARGV: owner, epoch, event id, error JSON.
local wrong = check_types(KEYS, 'hash', 'hash', 'hash', 'hash')
if wrong then return wrong end
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
  redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
end
return 'OK'
