-- What the queued resource holds.
--
-- KEYS[1..5] holds, data, queue, waiting, fence
-- returns {{hold, "<mode> <token> <count>", ms left, ...} of the live holds,
-- soonest expiry first, number of live queue entries}

local out = {}
local hs = redis.call('ZRANGEBYSCORE', H, '(' .. num(now), '+inf', 'WITHSCORES')
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = redis.call('HGET', D, hs[i]) or ''
  out[#out + 1] = tonumber(hs[i + 1]) - now
end
local waiting = 0
for _, h in ipairs(redis.call('LRANGE', Q, 0, -1)) do
  local w = redis.call('HGET', W, h)
  if w and tonumber(string.match(w, '^(%d+)')) > now then waiting = waiting + 1 end
end
return {out, waiting}
