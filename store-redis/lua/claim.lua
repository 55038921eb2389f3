-- Takes the lease (see take_lease in the prelude) and reads, in the same atomic step, what a
-- run needs to begin: the state hash and whether the outbox's first pending row exists (as
-- load_pending with a limit of 1 would find it).
-- KEYS: meta, state, outbox, rows. ARGV: owner, now, expires_at (now + ttl).
-- Returns nil when another owner's lease is still valid; else the new epoch as text, '1' or '0'
-- (a pending row or not), then the state's fields and values (none when it was never saved).
-- Every key's type is checked first: a read failing after the lease was taken would leave it
-- taken with no answer.
local wrong = check_types(KEYS, 'hash', 'hash', 'zset', 'hash')
if wrong then return wrong end
local epoch = take_lease(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if not epoch then return false end
local pending = '0'
local first = redis.call('ZRANGE', KEYS[3], 0, 0)
if first[1] and redis.call('HEXISTS', KEYS[4], first[1]) == 1 then
  pending = '1'
end
local out = {epoch, pending}
for _, value in ipairs(redis.call('HGETALL', KEYS[2])) do
  table.insert(out, value)
end
return out
