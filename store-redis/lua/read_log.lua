-- Log entries in sequence order with sequence > after and from <= created_at <= to, at most
-- `limit`. Sequences and times are sorted-set scores (exact up to 2^53).
-- KEYS: log, log rows, log times. ARGV: min sequence ('-inf' or '(<after>'), from ('' for none),
-- to ('' for none), limit (at least 1).
local from, to = tonumber(ARGV[2]), tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local out = {}
local offset = 0
while #out < limit do
  local sequences = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'LIMIT', offset, 512)
  if #sequences == 0 then
    break
  end
  offset = offset + #sequences
  for _, sequence in ipairs(sequences) do
    local at = tonumber(redis.call('ZSCORE', KEYS[3], sequence))
    if at and (from == nil or at >= from) and (to == nil or at <= to) then
      local row = redis.call('HGET', KEYS[2], sequence)
      if row then
        table.insert(out, row)
        if #out >= limit then
          break
        end
      end
    end
  end
end
return out
