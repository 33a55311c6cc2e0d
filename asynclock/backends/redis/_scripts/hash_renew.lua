-- The hash lock's renewal of many holds in one call.
--
-- KEYS[i] the lock hash of the i-th hold
-- ARGV[2i-1] its hold id, ARGV[2i] its ttl in ms (always > 0)
-- returns a list: 1 renewed (ttl reset), 0 not the holder (nothing changed), per hold

local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'owner') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
