-- The queued resource's renewal of many holds in one call.
--
-- KEYS[2i-1] holds ZSET, KEYS[2i] data HASH of the i-th hold
-- ARGV[2i-1] its hold id, ARGV[2i] its ttl in ms
-- returns a list: 1 renewed (expiry reset), 0 not a live holder (no change), per hold

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local out = {}
for i = 1, #ARGV / 2 do
  local h, d, hold, ttl = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local s = redis.call('ZSCORE', h, hold)
  if s and tonumber(s) > now then
    redis.call('ZADD', h, string.format('%.0f', now + ttl), hold)
    if redis.call('PTTL', h) < ttl then
      redis.call('PEXPIRE', h, 2 * ttl)
      redis.call('PEXPIRE', d, 2 * ttl)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
