-- What every script of the queued resource shares (see _shared.py for the layout).
-- KEYS[1..5] are always the resource's holds ZSET, data HASH, queue LIST,
-- waiting HASH and fence counter.

local H, D, Q, W, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)

local function num(x) return string.format('%.0f', x) end

-- a pair of keys written together (holds and data, or queue and waiting) lives
-- at least ms more; never shortened (other entries may need longer), and
-- extended to twice that, so that most requests need no PEXPIRE
local function keep(a, b, ms)
  local p = redis.call('PTTL', a)
  if p ~= -2 and p < ms then
    redis.call('PEXPIRE', a, 2 * ms)
    redis.call('PEXPIRE', b, 2 * ms)
  end
end

-- whether anybody holds the resource or waits for it (expired holds pruned already)
local function in_use()
  if redis.call('ZCARD', H) > 0 then return true end
  for _, w in ipairs(redis.call('HVALS', W)) do
    if tonumber(string.match(w, '^(%d+)')) > now then return true end
  end
  return false
end

-- drop expired holds; how many
local function prune()
  local gone = redis.call('ZRANGEBYSCORE', H, '-inf', num(now))
  for _, h in ipairs(gone) do
    redis.call('ZREM', H, h)
    redis.call('HDEL', D, h)
  end
  return #gone
end

local function fits(mode, permits)
  local n = redis.call('ZCARD', H)
  if n == 0 then return true end
  if mode == 'x' then return false end
  if mode == 's' then return n < permits end
  -- 'r': the holders are all readers or one writer; look at one of them
  local d = redis.call('HGET', D, redis.call('ZRANGE', H, 0, 0)[1])
  return d ~= false and string.sub(d, 1, 1) == 'r'
end

local function grant(hold, mode, ttl, fence_ms)
  local last = tonumber(redis.call('GET', F) or '0')
  local token = num(math.max(last + 1, now_us))
  redis.call('SET', F, token, 'PX', fence_ms)
  redis.call('ZADD', H, num(now + ttl), hold)
  redis.call('HSET', D, hold, mode .. ' ' .. token .. ' 1')
  keep(H, D, ttl)
  return token
end

-- grant queued waiters from the head while they fit, dropping dead entries on
-- the way; returns nil if the queue is empty now, the live head that does not
-- fit, or true after an exclusive grant (nobody else can fit then)
local function serve(permits, fence_ms)
  while true do
    local head = redis.call('LINDEX', Q, 0)
    if not head then return nil end
    local w = redis.call('HGET', W, head)
    local deadline, ttl, mode, channel
    if w then deadline, ttl, mode, channel = string.match(w, '^(%d+) (%d+) (%a) (.*)$') end
    if not w or tonumber(deadline) <= now then
      redis.call('LPOP', Q)
      redis.call('HDEL', W, head)
    elseif fits(mode, permits) then
      redis.call('LPOP', Q)
      redis.call('HDEL', W, head)
      local token = grant(head, mode, tonumber(ttl), fence_ms)
      if redis.call('PUBLISH', channel, head .. ' ' .. token) == 0 then
        -- nobody listens on its client's channel: the client is gone (or
        -- reconnecting, and then its waiters poll and queue again): take the
        -- grant back and serve the next
        redis.call('ZREM', H, head)
        redis.call('HDEL', D, head)
      elseif mode == 'x' then
        return true
      end
    else
      return head
    end
  end
end
