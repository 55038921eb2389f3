-- Gives the lease up if it is still the current one (a stale release is a silent no-op); the
-- epoch counter stays.
-- KEYS: meta. ARGV: owner, epoch.
if holds(KEYS[1], ARGV[1], ARGV[2]) then
  redis.call('HDEL', KEYS[1], 'owner', 'epoch', 'expires_at')
end
return 'OK'
