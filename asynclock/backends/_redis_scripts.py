"""The Lua scripts of the hash-layout Redis lock (Redis Cluster, Redlock's nodes).

(The plain lock on one server or through Sentinel is the fair lock's queued
resource: see ``_redis_primitives``.)

One hash per lock, ``<prefix>:{<name>}``, with fields ``owner`` (the hold id,
unique per acquisition), ``count`` (hold count) and ``token`` (fencing token),
expiring by PEXPIRE. Beside it ``<prefix>:{<name>}:fence`` remembers the last
token. A release is announced on ``<prefix>:{<name>}:released`` to every
subscriber (``RELEASE``, or ``RELEASE_SHARDED`` on a Cluster, where a script
cannot publish to a channel in another slot). All keys share the ``{<name>}``
hash tag, so the scripts touch one slot.

Fencing tokens are ``max(last token + 1, server time in microseconds)``. The
stored counter makes them strictly increasing while Redis keeps its data; the
time floor keeps them increasing after Redis restarts with no data (or the
counter key is evicted), because a new token is never smaller than the
server's clock and every earlier token was at most a few microseconds ahead of
the clock when it was issued. It assumes the server's clock does not step
backwards by more than the counter's lifetime.
"""

from __future__ import annotations

# The take-or-re-enter rule. take(owner, t):
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

# The acquire:
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
