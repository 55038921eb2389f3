-- One page of a poll cycle, all or nothing: the fence is checked first, and every write after it
-- runs in this one script, which Redis executes atomically.
-- KEYS: meta, state, items, ids, outbox, rows, attempts, errors, parked, hold, log, log rows,
--       log times, validators.
-- ARGV: owner, epoch, log ('1' or '0'),
--       n upserts, then identity, row JSON for each,
--       n deletes, then the identities,
--       n events, then event id, sequence, pending ('1' or '0'), row JSON, created_at,
--         logged-event JSON ('' unless log) for each,
--       n parked, then id, row JSON, has hold ('1' or '0'), hold key for each,
--       n validators, then url hash, validator JSON for each,
--       then the state arguments of write_state.
local meta, state, items, ids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local outbox, rows, attempts, errors = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local parked, hold, log, log_rows, log_at = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local validators = KEYS[14]
local wrong = check_types(KEYS, 'hash', 'hash', 'hash', 'zset', 'zset', 'hash', 'hash', 'hash',
  'hash', 'hash', 'zset', 'hash', 'zset', 'hash')
if wrong then return wrong end
if not holds(meta, ARGV[1], ARGV[2]) then
  return 'LEASE_LOST'
end
local logged = ARGV[3] == '1'
local i = 4

local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', items, ARGV[i], ARGV[i + 1])
  redis.call('ZADD', ids, 0, ARGV[i])
  i = i + 2
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HDEL', items, ARGV[i])
  redis.call('ZREM', ids, ARGV[i])
  i = i + 1
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local id, sequence, pending = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if pending == '1' then
    put_outbox(outbox, rows, attempts, errors, id, sequence, ARGV[i + 3])
  else
    remove_outbox(outbox, rows, attempts, errors, id)
  end
  if logged then
    redis.call('ZADD', log, sequence, sequence)
    redis.call('HSET', log_rows, sequence, ARGV[i + 5])
    redis.call('ZADD', log_at, ARGV[i + 4], sequence)
  end
  i = i + 6
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  put_parked(parked, hold, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
  i = i + 4
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', validators, ARGV[i], ARGV[i + 1])
  i = i + 2
end

write_state(state, ARGV, i)
return 'OK'
