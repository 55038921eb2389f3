-- Shared helpers, prepended to every script of watukuy's Redis store (see src/scripts.rs).
--
-- Every value arrives as an opaque string: JSON text is stored and returned as is, never decoded
-- here (no cjson), so payloads round-trip byte for byte. Integers that must compare exactly
-- (epochs, epoch milliseconds) are canonical decimal text and are compared as text.

-- True when the lease in the `meta` hash has exactly this owner and epoch (string compare).
local function holds(meta, owner, epoch)
  local held = redis.call('HMGET', meta, 'owner', 'epoch')
  return held[1] == owner and held[2] == epoch
end

-- Compares two canonical decimal integers (no leading zeros, no "+", "-0" never written):
-- -1, 0 or 1, exactly, whatever their size.
local function cmp_int(a, b)
  local neg_a, neg_b = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if neg_a ~= neg_b then
    if neg_a then return -1 else return 1 end
  end
  local sign = 1
  if neg_a then sign = -1 end
  if #a ~= #b then
    if #a < #b then return -sign else return sign end
  end
  if a == b then return 0 end
  if a < b then return -sign else return sign end
end

-- Takes the lease in the `meta` hash when it is free, expired (expires_at <= now) or already
-- this owner's, bumping the key's epoch counter (never reset, not even by delete_key). Returns
-- the new epoch as text, or false when another owner's lease is still valid.
local function take_lease(meta, owner, now, expires)
  local held = redis.call('HMGET', meta, 'owner', 'expires_at')
  if held[1] and held[1] ~= owner and cmp_int(held[2], now) > 0 then
    return false
  end
  redis.call('HINCRBY', meta, 'epoch_counter', 1)
  local epoch = redis.call('HGET', meta, 'epoch_counter')
  redis.call('HSET', meta, 'owner', owner, 'epoch', epoch, 'expires_at', expires)
  return epoch
end

-- Writes a state patch. From ARGV[first]: 7 field/value pairs of the complete state a first save
-- creates (zero state plus the patch), then the number of patch pairs and the pairs. An existing
-- state gets only the patch (top-level replace, created_at kept); an empty patch writes nothing.
-- Returns the index after the last argument read.
local function write_state(state, argv, first)
  local full_first = first
  local patch_count_at = full_first + 14
  local patch_count = tonumber(argv[patch_count_at])
  local after = patch_count_at + 1 + 2 * patch_count
  if redis.call('EXISTS', state) == 0 then
    redis.call('HSET', state, unpack(argv, full_first, full_first + 13))
  elseif patch_count > 0 then
    redis.call('HSET', state, unpack(argv, patch_count_at + 1, after - 1))
  end
  return after
end

-- Removes outbox row `id` with its delivery attempts and last error.
local function remove_outbox(outbox, rows, attempts, errors, id)
  redis.call('ZREM', outbox, id)
  redis.call('HDEL', rows, id)
  redis.call('HDEL', attempts, id)
  redis.call('HDEL', errors, id)
end

-- Puts pending outbox row `id` at `sequence`, replacing any row of that id and its attempts.
local function put_outbox(outbox, rows, attempts, errors, id, sequence, row)
  redis.call('HSET', rows, id, row)
  redis.call('ZADD', outbox, sequence, id)
  redis.call('HDEL', attempts, id)
  redis.call('HDEL', errors, id)
end

-- Inserts or replaces parked row `id` and its hold key (`has_hold` is '1' or '0').
local function put_parked(parked, hold, id, row, has_hold, hold_key)
  redis.call('HSET', parked, id, row)
  if has_hold == '1' then
    redis.call('HSET', hold, id, hold_key)
  else
    redis.call('HDEL', hold, id)
  end
end

-- Redis does not roll a script back when it fails half-way, so a script that writes several
-- keys first checks that none of them holds a foreign type (the only way a write of the store
-- can fail): `check_types(KEYS, 'hash', 'zset', ...)` names the type of each key, in order.
-- Returns an error reply (code WRONGTYPE) to return before writing anything, or nil.
local function check_types(keys, ...)
  local expected = {...}
  for i, want in ipairs(expected) do
    local have = redis.call('TYPE', keys[i])['ok']
    if have ~= 'none' and have ~= want then
      return redis.error_reply('WRONGTYPE ' .. keys[i] .. ' holds a ' .. have .. ', not a ' .. want)
    end
  end
  return nil
end

