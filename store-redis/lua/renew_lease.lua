-- Moves the expiry of the caller's lease if it is still the current one.
-- KEYS: meta. ARGV: owner, epoch, expires_at. Returns 1 when renewed, 0 otherwise.
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[3])
return 1
