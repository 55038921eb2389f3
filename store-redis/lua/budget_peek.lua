-- The tokens of a rate budget at `now` without taking any (nothing is written), as the whole
-- tokens and the remainder in token·ms units, so the caller computes the fraction exactly as
-- watukuy_core's BucketState::tokens does. Same preconditions as budget_take.lua.
-- KEYS: the bucket hash. ARGV: requests, per_ms, burst, now.
-- Returns {whole tokens, remainder units} as decimal text.
local requests, per = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, now = tonumber(ARGV[3]), tonumber(ARGV[4])

local function fmt(x) return string.format('%.17g', x) end

local stored = redis.call('HMGET', KEYS[1], 'level', 'last')
local level, last = burst * per, now
if stored[1] and stored[2] then
  level, last = tonumber(stored[1]), tonumber(stored[2])
end
local elapsed = now - last
if elapsed < 0 then elapsed = 0 end
level = math.min(burst * per, level + elapsed * requests)
local rest = math.fmod(level, per)
return {fmt((level - rest) / per), fmt(rest)}
