-- Takes `cost` tokens from a rate budget's token bucket, mirroring watukuy_core's BucketState
-- exactly: integer arithmetic in token·ms units, time from the caller (never Redis TIME).
--
-- The caller guarantees burst·per_ms <= 2^53, cost·per_ms <= 2^53 and |now| <= 2^53, so every
-- level, capacity and need is an integer a double holds exactly; a refill above 2^53 may round
-- but is then clamped to the exact capacity. Divisions go through math.fmod, which is exact.
-- KEYS: the bucket hash (`level`, `last`). ARGV: cost, requests, per_ms, burst, now.
-- Returns {1, remaining} when granted, {0, retry_in_ms} otherwise (numbers as decimal text).
local key = KEYS[1]
local cost, requests = tonumber(ARGV[1]), tonumber(ARGV[2])
local per, burst, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function fmt(x) return string.format('%.17g', x) end
local function floor_div(a, b) return (a - math.fmod(a, b)) / b end
local function ceil_div(a, b)
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then q = q + 1 end
  return q
end

local stored = redis.call('HMGET', key, 'level', 'last')
local level, last
if stored[1] and stored[2] then
  level, last = tonumber(stored[1]), tonumber(stored[2])
else
  -- A new bucket starts full, and exists from its first take on (even a free one).
  level, last = burst * per, now
  redis.call('HSET', key, 'level', fmt(level), 'last', fmt(last))
end

local cap = math.max(burst, cost) * per
local need = cost * per
local elapsed = now - last
if elapsed < 0 then elapsed = 0 end
level = math.min(cap, level + elapsed * requests)
if cost == 0 then
  return {1, fmt(floor_div(level, per))}
end
if now > last then last = now end
if level >= need then
  level = level - need
  redis.call('HSET', key, 'level', fmt(level), 'last', fmt(last))
  return {1, fmt(floor_div(level, per))}
end
redis.call('HSET', key, 'level', fmt(level), 'last', fmt(last))
local wait = ceil_div(need - level, requests)
if wait < 1 then wait = 1 end
return {0, fmt(wait)}
