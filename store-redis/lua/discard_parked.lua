-- Unfenced: deletes parked rows and their holds; returns how many rows were removed.
-- KEYS: parked, hold. ARGV: the ids.
local wrong = check_types(KEYS, 'hash', 'hash')
if wrong then return wrong end
local removed = 0
for i = 1, #ARGV do
  removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return removed
