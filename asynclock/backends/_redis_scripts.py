"""The Lua scripts of the Redis backend.

One hash per lock, ``<prefix>:{<name>}``, with fields ``owner`` (the hold id,
unique per acquisition), ``count`` (hold count) and ``token`` (fencing token),
expiring by PEXPIRE. Beside it ``<prefix>:{<name>}:fence`` remembers the last
token, and ``<prefix>:{<name>}:waiting`` (a sorted set) lists the clients
that wait for the lock: member the client's wake-up channel, score the
server time (ms) after which the entry is stale. A try that finds the lock
taken registers its client there; a release takes the first live entry and
publishes the lock's name on that client's channel alone, so one release
wakes one client, not every client with a waiter (``ACQUIRE_REGISTER``,
``RELEASE_WAKE``, ``LEAVE``). A try of a client that has no waiter for the
lock (the first try, or a try-lock) uses ``ACQUIRE`` and registers nothing.
All keys share the ``{<name>}`` hash tag, so the scripts touch one slot.

Redis Cluster cannot publish on a per-client channel from a script (the
channel is in another slot), and Redlock listens on its nodes itself: they use
``ACQUIRE`` and ``RELEASE``/``RELEASE_SHARDED``, which announce a release on
``<prefix>:{<name>}:released`` to every subscriber.

Fencing tokens are ``max(last token + 1, server time in microseconds)``. The
stored counter makes them strictly increasing while Redis keeps its data; the
time floor keeps them increasing after Redis restarts with no data (or the
counter key is evicted), because a new token is never smaller than the
server's clock and every earlier token was at most a few microseconds ahead of
the clock when it was issued. It assumes the server's clock does not step
backwards by more than the counter's lifetime.
"""

from __future__ import annotations

# The take-or-re-enter rule both acquire scripts share. take(owner, t):
# with no owner, take the lock for ARGV[1] (token from the fence rule; t is
# the server's TIME if the caller has it already); if ARGV[1] owns it, reset
# its ttl; either way {1, token}. nil if another hold has it.
_TAKE = """
local function take(owner, t)
  if not owner then
    if not t then
      if redis.replicate_commands then redis.replicate_commands() end
      t = redis.call('TIME')
    end
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = tonumber(redis.call('GET', KEYS[2]) or '0')
    local token = string.format('%.0f', math.max(last + 1, now))
    redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
    redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, token}
  end
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, redis.call('HGET', KEYS[1], 'token')}
  end
  return nil
end
"""

# The acquire that registers no waiter (a first try, a try-lock; Cluster; Redlock's nodes):
# KEYS[1] lock hash, KEYS[2] fence counter
# ARGV[1] hold id, ARGV[2] ttl in ms, ARGV[3] fence counter lifetime in ms
# returns {1, token} if ARGV[1] holds it now (new, or already: retries are
# idempotent), {0, pttl} if another hold has it
ACQUIRE = (
    _TAKE
    + """
local got = take(redis.call('HGET', KEYS[1], 'owner'), nil)
if got then return got end
return {0, redis.call('PTTL', KEYS[1])}
"""
)

# KEYS[1] lock hash
# ARGV[1] hold id, ARGV[2] hold count, ARGV[3] ttl in ms
# returns 1 if ARGV[1] holds it (count recorded, ttl reset), 0 otherwise (no change)
SET_COUNT = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'count', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"""

# The release announced to every subscriber (Cluster, Redlock nodes):
# KEYS[1] lock hash, KEYS[2] release channel (same slot)
# ARGV[1] hold id
# returns 1 if released (and one message published), 0 if ARGV[1] did not hold it (no change)
_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('{publish}', KEYS[2], ARGV[1])
  return 1
end
return 0
"""
RELEASE = _RELEASE.format(publish="PUBLISH")
#: Redis Cluster: announced on the lock's shard channel (Redis >= 7).
RELEASE_SHARDED = _RELEASE.format(publish="SPUBLISH")

# The wake-up of the next waiting client, shared by the scripts below (KEYS[2]
# the waiting set, KEYS[3] the turn key, ARGV[1] the lock's name, ARGV[2] the
# turn in ms): entries are taken in score order; stale ones are dropped, and
# so is a client that no longer listens (PUBLISH reached nobody: gone, or
# reconnecting, and then it wakes all its waiters itself). The woken client
# gets a short turn: until it tries (or the turn ends), tries of other clients
# are answered as if the lock were taken, so the releaser cannot take the lock
# straight back from under the client it woke. Returns 1 if a client was
# woken, 0 if nobody waits.
_WAKE_NEXT = """
local function wake_next()
  local now
  while true do
    local head = redis.call('ZPOPMIN', KEYS[2])
    if #head == 0 then return 0 end
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    if tonumber(head[2]) >= now and redis.call('PUBLISH', head[1], ARGV[1]) > 0 then
      redis.call('SET', KEYS[3], head[1], 'PX', ARGV[2])
      return 1
    end
  end
end
"""

# The waiting set's scores and lifetime (ms) from a lock ttl: an entry lives
# for the holder's remaining time plus one more ttl, long enough for the
# waiter's next try (which it makes at the latest when that time is up) to
# refresh it.
_REGISTER = """
local function register(channel, now, pttl, ttl)
  local life = math.max(pttl, 0) + ttl
  redis.call('ZADD', KEYS[3], now + life, channel)
  if redis.call('PTTL', KEYS[3]) < life then redis.call('PEXPIRE', KEYS[3], life) end
end
"""

# KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting set, KEYS[4] turn key
# ARGV[1] hold id, ARGV[2] ttl in ms, ARGV[3] fence counter lifetime in ms,
# ARGV[4] this client's wake-up channel, ARGV[5] how long (ms) this client's
# entry must live if this try wins, because it has other waiters for the lock
# (until their next tries), 0 if it has none, -1 to leave the waiting set alone
# (a client that does not wait for the lock: a first try, a try-lock).
# A free lock that is another client's turn (see _WAKE_NEXT) answers {0, the
# turn's remaining ms}; this client's own turn ends when it tries.
# returns as ACQUIRE. A try that finds the lock taken registers the client in
# the waiting set (or refreshes its entry); one that wins keeps the client's
# entry (at the back) while it has other waiters, and removes it otherwise.
ACQUIRE_REGISTER = (
    _REGISTER
    + _TAKE
    + """
if redis.replicate_commands then redis.replicate_commands() end
-- the server's time, read once and only when needed (a first try that
-- takes a free lock needs none)
local t, now_ms
local function clock()
  if not t then
    t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end
local owner = redis.call('HGET', KEYS[1], 'owner')
local stay = tonumber(ARGV[5])
if not owner then
  local turn = redis.call('GET', KEYS[4])
  if turn == ARGV[4] then
    redis.call('DEL', KEYS[4])
  elseif turn then
    local left = redis.call('PTTL', KEYS[4])
    if stay >= 0 then register(ARGV[4], clock(), left, tonumber(ARGV[2])) end
    return {0, left}
  end
end
if stay >= 0 and (not owner or owner == ARGV[1]) then
  if stay > 0 then
    register(ARGV[4], clock(), 0, tonumber(ARGV[5]))
  else
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
end
local got = take(owner, t)
if got then return got end
local pttl = redis.call('PTTL', KEYS[1])
if stay >= 0 then register(ARGV[4], clock(), pttl, tonumber(ARGV[2])) end
return {0, pttl}
"""
)

# KEYS[1] lock hash, KEYS[2] waiting set, KEYS[3] turn key (same slot)
# ARGV[1] the lock's name (the wake-up message), ARGV[2] the woken client's
# turn in ms, ARGV[3] hold id
# returns 1 if released (and the first live waiting client, if any, woken on
# its own channel), 0 if ARGV[3] did not hold it (no change)
RELEASE_WAKE = (
    _WAKE_NEXT
    + """
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[3] then
  redis.call('DEL', KEYS[1])
  wake_next()
  return 1
end
return 0
"""
)

# KEYS[1] lock hash, KEYS[2] waiting set, KEYS[3] turn key
# ARGV[1] the lock's name, ARGV[2] the next client's turn in ms, ARGV[3] this
# client's wake-up channel, ARGV[4] "1" to pass a wake-up on, "0" not to
# A client whose waiters for the lock have all left takes its entry out of the
# waiting set and, if they left a wake-up (or its turn) unused, passes it on. Returns 1 if
# the lock is free and another waiting client was woken, 0 otherwise (the lock
# is taken, and its holder's release wakes the next; or nobody waits).
LEAVE = (
    _WAKE_NEXT
    + """
if redis.replicate_commands then redis.replicate_commands() end
redis.call('ZREM', KEYS[2], ARGV[3])
local pass = ARGV[4] == '1'
if redis.call('GET', KEYS[3]) == ARGV[3] then
  redis.call('DEL', KEYS[3])
  pass = true
end
if not pass or redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return wake_next()
"""
)

# KEYS[i] lock hash of the i-th lease
# ARGV[2i-1] its hold id, ARGV[2i] its ttl in ms (always > 0)
# returns a list: 1 renewed, 0 not the holder (nothing changed), per lease
RENEW_MANY = """
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
"""

# KEYS[1] lock hash
# returns {owner or false, count, token, pttl}
INFO = """
local v = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token')
return {v[1], v[2], v[3], redis.call('PTTL', KEYS[1])}
"""
