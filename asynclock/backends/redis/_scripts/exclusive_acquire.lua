-- The exclusive lock's acquire: take it, re-enter it, queue, or poll.
--
-- KEYS[1] X, KEYS[2] Q
-- ARGV[1] hold id, ARGV[2] ttl in ms (of the hold, and of the queue entry
-- until the next poll), ARGV[3] 1: queue (or stay queued) if it cannot be had
-- now, 0: never queue, ARGV[4] the channel of the caller's client, ARGV[5] 1
-- on the first request of this hold id (it cannot be queued yet), ARGV[6] its
-- queue entry as last answered ('' if none), ARGV[7] an election's channel,
-- told X's value whenever this call changes who holds X ('' or absent: a lock)
-- returns the token (an integer) if ARGV[1] holds it now (just taken, or
-- already: a retry, a poll after a hand-over; its expiry is reset to ARGV[2]
-- from now), else a string "<ms until the holder's lease ends if ARGV[1]
-- is queued, -1 otherwise> <its queue entry, empty if not queued>"

local hold, ttl = ARGV[1], tonumber(ARGV[2])
E = ARGV[7] or ''
local v = redis.call('GET', X)
local tok, count, flag, exp, holder
if v then
  tok, count, flag, exp, holder = parse(v)
  if not holder then -- free: nobody is queued (a release hands over while anybody is)
    local t = token(tonumber(v))
    hold_x(t, 1, '-', hold, ttl)
    announce()
    return t
  end
elseif redis.call('EXISTS', Q) == 0 then -- never used, expired or lost, and nobody queued
  local t = token(nil)
  hold_x(t, 1, '-', hold, ttl)
  announce()
  return t
end
if holder == hold then -- a retry, or a poll after a hand-over: still ours
  hold_x(tonumber(tok), count, flag, hold, ttl)
  return tonumber(tok)
end
if not holder then -- the holder expired while others are queued: the queue goes first
  local t
  holder, t, exp = serve(nil, hold)
  if holder == hold then
    announce()
    return t
  end
  if not holder then -- nobody queued is alive
    t = token(t)
    hold_x(t, 1, '-', hold, ttl)
    announce()
    return t
  end
  announce()
  flag = 'q'
end
if ARGV[3] ~= '1' then return '-1 ' end
clock()
local entry = num(now + ttl) .. ' ' .. ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. hold
local at
if ARGV[5] ~= '1' then at = find(hold, ARGV[6]) end
if at then
  redis.call('LSET', Q, at, entry)
  redis.call('PEXPIRE', Q, 2 * ttl, 'GT')
else
  at = redis.call('RPUSH', Q, entry) - 1
  if at == 0 then redis.call('PEXPIRE', Q, 2 * ttl) else redis.call('PEXPIRE', Q, 2 * ttl, 'GT') end
end
if flag ~= 'q' then -- the holder's release must hand over now
  redis.call('SET', X, tok .. ' ' .. count .. ' q ' .. exp .. ' ' .. holder, 'PXAT', exp)
end
-- every waiter is told when the holder's lease ends, not just the head: if
-- the holder died, the first live waiter's poll then serves the queue (a dead
-- head is passed over: its grant reaches nobody), within a round trip
return num(math.max(0, tonumber(exp) - now)) .. ' ' .. entry
