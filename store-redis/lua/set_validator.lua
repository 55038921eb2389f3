-- Fenced: stores the validators of a URL hash.
-- KEYS: meta, validators. ARGV: owner, epoch, url hash, validator JSON.
if not holds(KEYS[1], ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return 'OK'
