-- The exclusive lock's renewal of many holds in one call.
--
-- KEYS[i] the lock X of the i-th hold
-- ARGV[2i-1] its hold id, ARGV[2i] its ttl in ms
-- returns one character per hold: '1' renewed (expiry reset to the ttl from
-- now), '0' not the holder (no change)

if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = '0'
  local v = redis.call('GET', key)
  if v then
    local tok, count, flag, _, holder = string.match(v, '^(%d+) (%d+) (%S) (%d+) (.*)$')
    if holder == ARGV[2 * i - 1] then
      local exp = string.format('%.0f', now + tonumber(ARGV[2 * i]))
      redis.call('SET', key, tok .. ' ' .. count .. ' ' .. flag .. ' ' .. exp .. ' ' .. holder, 'PXAT', exp)
      out[i] = '1'
    end
  end
end
return table.concat(out)
