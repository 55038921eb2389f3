-- Takes the lease when it is free, expired (expires_at <= now) or already this owner's, bumping
-- the key's epoch counter (never reset, not even by delete_key).
-- KEYS: meta. ARGV: owner, now, expires_at (now + ttl, computed by the caller).
-- Returns the new epoch as text, or nil when another owner's lease is still valid.
local wrong = check_types(KEYS, 'hash')
if wrong then return wrong end
local meta, owner, now, expires = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local held = redis.call('HMGET', meta, 'owner', 'expires_at')
if held[1] and held[1] ~= owner and cmp_int(held[2], now) > 0 then
  return false
end
redis.call('HINCRBY', meta, 'epoch_counter', 1)
local epoch = redis.call('HGET', meta, 'epoch_counter')
redis.call('HSET', meta, 'owner', owner, 'epoch', epoch, 'expires_at', expires)
return epoch
