-- What the exclusive lock's scripts share (see _exclusive.py for the layout;
-- an election is the same lock under keys of its own, see _election.py).
-- KEYS[1] is always the lock X, KEYS[2] its queue Q.

local X, Q = KEYS[1], KEYS[2]
if redis.replicate_commands then redis.replicate_commands() end
local now_us, now -- the server's time (us, ms), read at most once per script

local function clock()
  if not now then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now = math.floor(now_us / 1000)
  end
end

local function num(x) return string.format('%.0f', x) end

-- an election's channel ('' for a lock): a script that changes who holds X
-- sets it from its arguments, and calls announce() after the change
local E = ''
local function announce()
  if E ~= '' then redis.call('PUBLISH', E, redis.call('GET', X) or '') end
end

-- a new token: one more than the last, and never below the server's clock in us
local function token(last)
  clock()
  if last and last + 1 > now_us then return last + 1 end
  return now_us
end

-- token, count, flag, expiry (ms) and holder of a held X; nil for a free one
local function parse(v)
  return string.match(v, '^(%d+) (%d+) (%S) (%d+) (.*)$')
end

-- X held by `hold` for `ttl` ms from now; flag 'q': somebody may be queued
local function hold_x(tok, count, flag, hold, ttl)
  clock()
  local exp = num(now + ttl)
  redis.call('SET', X, num(tok) .. ' ' .. count .. ' ' .. flag .. ' ' .. exp .. ' ' .. hold, 'PXAT', exp)
  return exp
end

-- hand the lock to the first live entry of Q, dropping dead ones on the way;
-- `caller` (a hold that polls) is answered by the script, the others by a
-- message on their client's channel. A grant whose message reaches nobody
-- (the client is gone) is taken back and the next is served.
-- returns the new holder, its token and expiry; or nil and the last token
-- issued (nil if none: X untouched)
local function serve(last, caller)
  clock()
  while true do
    local e = redis.call('LPOP', Q)
    if not e then return nil, last end
    local deadline, ttl, channel, head = string.match(e, '^(%d+) (%d+) (.*) (%S+)$')
    if deadline and tonumber(deadline) > now then
      local tok = token(last)
      local exp = hold_x(tok, 1, 'q', head, tonumber(ttl))
      if head == caller or redis.call('PUBLISH', channel, head .. ' ' .. num(tok)) > 0 then
        return head, tok, exp
      end
      last = tok
    end
  end
end

-- the position and text of `hold`'s queue entry (`known`: its text as last
-- answered, which spares the scan); nil if it is not queued
local function find(hold, known)
  if known ~= '' then
    local at = redis.call('LPOS', Q, known)
    if at then return at, known end
  end
  local tail = ' ' .. hold
  for i, e in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    if string.sub(e, -#tail) == tail then return i - 1, e end
  end
  return nil
end
