-- The queued resource's hold count (kept for info() and tools).
--
-- KEYS[1..5] holds, data, queue, waiting, fence
-- ARGV[1] hold id, ARGV[2] hold count, ARGV[3] ttl in ms
-- returns 1 if ARGV[1] holds it (count recorded, expiry reset), 0 otherwise (no change)

local s = redis.call('ZSCORE', H, ARGV[1])
if s and tonumber(s) > now then
  local mode, token = string.match(redis.call('HGET', D, ARGV[1]), '^(%a) (%d+)')
  redis.call('HSET', D, ARGV[1], mode .. ' ' .. token .. ' ' .. ARGV[2])
  redis.call('ZADD', H, num(now + tonumber(ARGV[3])), ARGV[1])
  keep(H, D, tonumber(ARGV[3]))
  return 1
end
return 0
