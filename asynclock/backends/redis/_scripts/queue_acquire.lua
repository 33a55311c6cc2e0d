-- The queued resource's acquire: take it, re-enter it, queue, or poll.
--
-- KEYS[1..5] holds, data, queue, waiting, fence
-- ARGV[1] hold id, ARGV[2] mode (x, r, s), ARGV[3] permits, ARGV[4] ttl in ms
-- (of the hold, and of the queue entry until the next poll), ARGV[5] 1: queue
-- (or stay queued) if it cannot be had now, 0: never queue, ARGV[6] the
-- channel of the caller's client, ARGV[7] fence counter lifetime in ms,
-- ARGV[8] 1 on the first request of this hold id (it cannot hold or be queued yet)
-- returns {1, token} if ARGV[1] holds it now (just taken, or already: a retry,
-- a poll after a hand-over; its expiry is reset to ARGV[4]), {0, ms until
-- the first holder's lease ends (-1: no holder, or not queued)}, or {-1,
-- permits} (nothing changed) for a semaphore whose holders and waiters use
-- another number of permits than ARGV[3]

local hold, mode, permits, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local pruned = prune()
if mode == 's' then
  local agreed = tonumber(redis.call('HGET', D, '#permits') or permits)
  if agreed ~= permits and in_use() then return {-1, agreed} end
  redis.call('HSET', D, '#permits', permits)
end
local head
if pruned == 0 and mode == 'x' and redis.call('ZCARD', H) > 0 then
  -- held, and no hold ended since the last script served the queue: an
  -- exclusive request does not fit, and serving could at most drop dead
  -- entries (or, for readers behind a dead writer, wait for the next request)
  head = true
else
  head = serve(permits, ARGV[7])
end
if ARGV[8] ~= '1' then
  local d = redis.call('HGET', D, hold)
  if d then
    redis.call('ZADD', H, num(now + ttl), hold)
    keep(H, D, ttl)
    return {1, string.match(d, '^%a (%d+)')}
  end
end
if head == nil and fits(mode, permits) then
  return {1, grant(hold, mode, ttl, ARGV[7])}
end
-- not free (somebody holds it or is queued: never empty, nothing to tidy)
if ARGV[5] ~= '1' then return {0, -1} end
if ARGV[8] == '1' or head == nil or not redis.call('HGET', W, hold) then
  redis.call('RPUSH', Q, hold)
end
redis.call('HSET', W, hold, num(now + ttl) .. ' ' .. ttl .. ' ' .. mode .. ' ' .. ARGV[6])
keep(Q, W, ttl)
-- every waiter is told when the first holder's lease ends, not just the
-- head: if the holders died, the first live waiter's poll then serves the
-- queue (a dead head is passed over: its grant reaches nobody)
local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
local hint = -1
if first[2] then hint = math.max(0, tonumber(first[2]) - now) end
return {0, hint}
