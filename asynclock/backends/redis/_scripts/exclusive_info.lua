-- What the exclusive lock holds.
--
-- KEYS[1] X, KEYS[2] Q
-- returns {holder or false, hold count, token, ms left, live queue entries}

local v = redis.call('GET', X)
clock()
local waiting = 0
for _, e in ipairs(redis.call('LRANGE', Q, 0, -1)) do
  local deadline = string.match(e, '^(%d+) ')
  if deadline and tonumber(deadline) > now then waiting = waiting + 1 end
end
if v then
  local tok, count, _, exp, holder = parse(v)
  if holder then return {holder, count, tok, tonumber(exp) - now, waiting} end
end
return {false, 0, false, -1, waiting}
