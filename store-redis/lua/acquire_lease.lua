-- Takes the lease (see take_lease in the prelude).
-- KEYS: meta. ARGV: owner, now, expires_at (now + ttl, computed by the caller).
-- Returns the new epoch as text, or nil when another owner's lease is still valid.
local wrong = check_types(KEYS, 'hash')
if wrong then return wrong end
return take_lease(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
