"""The fair lock, the read-write lock and the semaphore on one Redis server.

All three are one *queued resource* in Redis, told apart by the mode of each
request: ``x`` (exclusive: the fair lock, the write side), ``r`` (shared: the
read side) and ``s`` (one of ``permits``: the semaphore). A resource of the
family ``fair``, ``rw`` or ``sem`` and the name ``N`` is five keys sharing the
``{N}`` hash tag (``<base>`` is ``<prefix>:{N}:<family>``):

* ``<base>``: ZSET of the holds, scored by the server-time (ms) at which each
  expires. Every hold has its own expiry, so a dead reader or semaphore holder
  lets go after its own ttl while the others keep theirs.
* ``<base>:data``: HASH hold id -> ``"<mode> <token> <count>"``; for a
  semaphore also ``#permits`` -> the number of permits its holders and
  waiters use (a client that asks with another number is refused while any
  of them is there: two numbers for one semaphore would let too many in).
* ``<base>:queue``: LIST of the queued hold ids, oldest first.
* ``<base>:waiting``: HASH queued hold id -> ``"<deadline ms> <ttl ms> <mode>
  <channel>"``: the entry's server-time deadline (a waiter keeps it alive by
  polling), the ttl its hold gets, and the pub/sub channel its client listens to.
* ``<base>:fence``: the last fencing token, the same rule as the plain lock
  (``max(last + 1, server time in µs)``), shared by both sides of a rw lock.

Every script first drops expired holds and then *serves* the queue: from the
head, dead entries (deadline passed) are dropped and live ones are granted as
long as they fit (one ``x`` on an empty resource; ``r`` while only readers
hold it; ``s`` while fewer than ``permits`` hold it). A granted waiter becomes
a holder inside the script (token, expiry from its own ttl) and one message,
``"<hold> <token>"``, is published on its client's channel: its client owns
the lock when the message arrives, and nobody else is woken (no herd). A
grant whose message reaches nobody (the client is gone, or its pub/sub
connection is reconnecting, after which its waiters poll and queue again) is
taken back at once and the next in line is served. An
acquire takes the resource directly only when nobody is queued and it fits,
so nobody jumps the queue, not even ``timeout=0`` (which never queues).

Read-write policy: FIFO phases. A writer in the queue keeps every later
reader behind it; the readers queued behind it get in together once it is
done, up to the next queued writer.

All times are the server's (``TIME``), never the clients' clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import BackendUnavailable, ConfigurationError, LockError
from .._legacy import LegacyBackend as Backend
from .._legacy import Shape
from .._values import LockInfo
from ..abc import Acquired, BackendHooks, Busy, RenewItem
from .redis import FENCE_LIFETIME_MS, _call, _is_readonly, _ms, _text

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = ["Handovers", "RedisQueued"]

logger = logging.getLogger("asynclock")

#: Request mode of each shape.
MODES = {"fair": "x", "write": "x", "read": "r", "semaphore": "s"}
#: Key family of each shape (both sides of a read-write lock are one resource).
FAMILIES = {"fair": "fair", "write": "rw", "read": "rw", "semaphore": "sem"}
#: Holds renewed by one script call (two keys each).
RENEW_CHUNK = 1000
#: Longest pause between retries of a request that failed.
RETRY_MAX = 1.0

# The functions every script shares. KEYS[1..5] are always the resource's
# holds ZSET, data HASH, queue LIST, waiting HASH and fence counter.
_PRELUDE = """
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
"""

# KEYS[1..5] holds, data, queue, waiting, fence
# ARGV[1] hold id, ARGV[2] mode (x, r, s), ARGV[3] permits, ARGV[4] ttl in ms
# (of the hold, and of the queue entry until the next poll), ARGV[5] 1: queue
# (or stay queued) if it cannot be had now, 0: never queue, ARGV[6] the
# channel of the caller's client, ARGV[7] fence counter lifetime in ms, ARGV[8]
# 1 on the first request of this hold id (it cannot hold or be queued yet)
# returns {1, token} if ARGV[1] holds it now (just taken, or already: a retry,
# a poll after a hand-over; its expiry is reset to ARGV[4]), {0, ms until
# the first holder's lease ends (-1: no holder, or not asked), 1 if ARGV[1]
# heads the queue}, or {-1, permits} (nothing changed) for a semaphore whose
# holders and waiters use another number of permits than ARGV[3]
ACQUIRE = (
    _PRELUDE
    + """
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
if ARGV[5] ~= '1' then return {0, -1, 0} end
local first_in_line
if ARGV[8] ~= '1' and head ~= nil and redis.call('HGET', W, hold) then
  first_in_line = head == hold or (head == true and redis.call('LINDEX', Q, 0) == hold)
else
  first_in_line = redis.call('RPUSH', Q, hold) == 1
end
redis.call('HSET', W, hold, num(now + ttl) .. ' ' .. ttl .. ' ' .. mode .. ' ' .. ARGV[6])
keep(Q, W, ttl)
if not first_in_line then return {0, -1, 0} end
local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
local hint = -1
if first[2] then hint = tonumber(first[2]) - now end
return {0, hint, 1}
"""
)

# KEYS[1..5] holds, data, queue, waiting, fence
# ARGV[1] hold id, ARGV[2] permits (a semaphore's holders' own number wins),
# ARGV[3] 1: only leave the queue (a hold stays), 0: also give up the hold,
# ARGV[4] fence counter lifetime in ms
# returns {1} released, {2, token} still held (ARGV[3] = 1, nothing changed),
# {0} not a holder (its queue entry, if any, is gone); whatever it frees is
# handed to the queue's head
RELEASE = (
    _PRELUDE
    + """
local hold = ARGV[1]
local permits = tonumber(redis.call('HGET', D, '#permits') or ARGV[2])
prune()
local out = {0}
if ARGV[3] == '1' then
  local d = redis.call('HGET', D, hold)
  if d then return {2, string.match(d, '^%a (%d+)')} end
elseif redis.call('ZREM', H, hold) == 1 then
  redis.call('HDEL', D, hold)
  out = {1}
end
if out[1] == 0 and redis.call('HDEL', W, hold) == 1 then
  redis.call('LREM', Q, 0, hold)
end
if serve(permits, ARGV[4]) == nil and redis.call('ZCARD', H) == 0 then
  redis.call('DEL', H, D, Q, W)
end
return out
"""
)

# KEYS[1..5] holds, data, queue, waiting, fence
# ARGV[1] hold id, ARGV[2] hold count, ARGV[3] ttl in ms
# returns 1 if ARGV[1] holds it (count recorded, expiry reset), 0 otherwise (no change)
SET_COUNT = (
    _PRELUDE
    + """
local s = redis.call('ZSCORE', H, ARGV[1])
if s and tonumber(s) > now then
  local mode, token = string.match(redis.call('HGET', D, ARGV[1]), '^(%a) (%d+)')
  redis.call('HSET', D, ARGV[1], mode .. ' ' .. token .. ' ' .. ARGV[2])
  redis.call('ZADD', H, num(now + tonumber(ARGV[3])), ARGV[1])
  keep(H, D, tonumber(ARGV[3]))
  return 1
end
return 0
"""
)

# KEYS[2i-1] holds ZSET, KEYS[2i] data HASH of the i-th hold
# ARGV[2i-1] its hold id, ARGV[2i] its ttl in ms
# returns a list: 1 renewed (expiry reset), 0 not a live holder (no change), per hold
RENEW_MANY = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local out = {}
for i = 1, #ARGV / 2 do
  local h, d, hold, ttl = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local s = redis.call('ZSCORE', h, hold)
  if s and tonumber(s) > now then
    redis.call('ZADD', h, string.format('%.0f', now + ttl), hold)
    if redis.call('PTTL', h) < ttl then
      redis.call('PEXPIRE', h, 2 * ttl)
      redis.call('PEXPIRE', d, 2 * ttl)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# KEYS[1..5] holds, data, queue, waiting, fence
# returns {{hold, "<mode> <token> <count>", ms left, ...} of the live holds,
# soonest expiry first, number of live queue entries}
INFO = (
    _PRELUDE
    + """
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
"""
)


class _PermitsDiffer(ValueError):
    """A semaphore acquired with another number of permits than its holders and waiters use."""


@dataclass(slots=True, eq=False)
class _Ticket:
    """One queued acquire of this client, waiting for its hand-over message."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    token: int | None = None


class Handovers:
    """The backend's one pub/sub channel on which the server hands it locks.

    Every adapter of a backend shares it; messages are ``"<hold> <token>"``
    and are routed to the acquire waiting for that hold id. After the
    listener reconnects (messages may have been missed) every waiter polls.
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._tickets: dict[str, _Ticket] = {}
        self._routing: asyncio.Task[None] | None = None

    async def ready(self, backend: RedisBackend) -> None:
        """Make sure the channel is subscribed (once per backend)."""
        listener = backend._listener
        if listener is None:
            raise BackendUnavailable("the Redis backend is closed")
        routing = self._routing
        if (
            routing is None
            or (routing.done() and (routing.cancelled() or routing.exception() is not None))
            or listener.failure is not None  # stopped on a refusal: try once more
        ):
            routing = self._routing = asyncio.get_running_loop().create_task(
                listener.route(self.channel, self.handle, self.resync), name="asynclock-redis-route"
            )
        await asyncio.shield(routing)

    def expect(self, hold: str) -> _Ticket:
        ticket = self._tickets[hold] = _Ticket()
        return ticket

    def forget(self, hold: str) -> None:
        self._tickets.pop(hold, None)

    def handle(self, payload: bytes) -> None:
        hold, _, token = payload.decode("utf-8", "replace").rpartition(" ")
        ticket = self._tickets.get(hold)
        if ticket is not None and token.isdigit():
            ticket.token = int(token)
            ticket.event.set()

    def resync(self) -> None:
        for ticket in self._tickets.values():
            ticket.event.set()


class RedisQueued:
    """The adapter of a queued shape (fair lock, read or write side, semaphore) on Redis."""

    kind = "redis"
    queues_waiters = True

    def __init__(self, backend: RedisBackend, shape: Shape) -> None:
        self._backend = backend
        self._shape = shape
        self._mode = MODES[shape.kind]
        self._family = FAMILIES[shape.kind]
        self._permits = shape.permits if shape.kind == "semaphore" else 1
        client = backend.client
        self._acquire = client.register_script(ACQUIRE)
        self._release = client.register_script(RELEASE)
        self._set_count = client.register_script(SET_COUNT)
        self._renew = client.register_script(RENEW_MANY)
        self._info = client.register_script(INFO)
        self._hooks: BackendHooks | None = None
        self._tickets: set[_Ticket] = set()  # of this adapter's acquires in progress
        self._waiting: set[asyncio.Task[Any]] = set()  # the tasks running them
        self._closed = False

    # -- keys -----------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        return self._backend.shape_key(name, self._family)

    def _keys(self, name: str) -> list[str]:
        base = self.lock_key(name)
        return [base, f"{base}:data", f"{base}:queue", f"{base}:waiting", f"{base}:fence"]

    # -- protocol ----------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        return ttl

    def primitive(self, shape: Shape) -> Backend:
        raise NotImplementedError("an adapter has no further primitives")

    async def start(self, hooks: BackendHooks) -> None:
        # No I/O: the hand-over channel is subscribed by the first acquire that queues.
        self._hooks = hooks

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        raise NotImplementedError("queued shapes use wait_acquire")

    async def _enter(
        self, name: str, hold: str, ttl: float, queue: bool, handovers: Handovers, first: bool = False
    ) -> tuple[int, int]:
        """One ACQUIRE: (token, 0) if held now, else (-1, hint).

        ``hint``: for the head of the queue, ms until the first holder's lease
        ends (-1: no holder); -2 for everyone else (they poll at their own pace).
        ``first``: the first request of ``hold`` (not a retry), which skips the
        look-ups that make retries idempotent.
        """
        keys = self._keys(name)
        args: list[str | int] = [
            hold,
            self._mode,
            self._permits,
            _ms(ttl),
            1 if queue else 0,
            handovers.channel,
            FENCE_LIFETIME_MS,
            1 if first else 0,
        ]
        backend = self._backend
        # Bounded: a server that stops answering (no connection error, no
        # read timeout on the client) ends the request after a ttl (plus the
        # replicas' WAIT), and the caller's retries give up after a ttl of
        # such failures. A request cut short is repeated by the next poll
        # (same hold id: the script is idempotent) or given back by identity.
        bound = ttl + (backend._replica_timeout_ms / 1000 if backend.replicas else 0.0)
        try:
            async with asyncio.timeout(bound):
                if not backend.replicas:
                    answer = await _call(self._acquire(keys=keys, args=args), backend)
                    confirmed = 0
                else:
                    # On the same connection, WAIT for the replicas: once this write is
                    # on them, so is every earlier one, a hand-over to this hold included.
                    answer, confirmed = await backend._script_then_wait(self._acquire, keys, args)
        except TimeoutError as exc:
            raise BackendUnavailable(f"{backend.where} did not answer within {bound:.3g} s") from exc
        if backend.replicas and int(answer[0]) == 1 and confirmed < backend.replicas:
            # Not on enough replicas: a failover now could lose it. Give it
            # back (to the next in line); the caller retries or fails.
            await self.release(name, hold)
            raise BackendUnavailable(
                f"only {confirmed} of {backend.replicas} replicas confirmed the acquire within the replica timeout"
            )
        if int(answer[0]) == 1:
            return int(answer[1]), 0
        if int(answer[0]) == -1:
            raise _PermitsDiffer(
                f"semaphore {name!r} is used with permits={int(answer[1])} by its holders and waiters;"
                f" this handle asks for permits={self._permits} (every client must use the same number)"
            )
        return -1, int(answer[1]) if int(answer[2]) == 1 else -2

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if timeout is None else started + timeout
        queue = timeout != 0
        handovers = self._backend.handovers()
        listener = self._backend._listener
        if listener is not None:
            listener.note_ttl(ttl)  # its health check keeps up with this waiter's ttl
        if queue:
            await handovers.ready(self._backend)
        ticket = handovers.expect(hold)
        self._tickets.add(ticket)
        me = asyncio.current_task()
        if me is not None:
            self._waiting.add(me)
        try:
            # The first request: retried (same hold id, the script is idempotent)
            # for a request window when it does not reach the server.
            window = min(ttl / 3, 1.0)
            delay = 0.02
            first = True
            while True:
                sent = loop.time()
                try:
                    token, hint = await self._enter(name, hold, ttl, queue, handovers, first)
                    break
                except BackendUnavailable as exc:
                    # Like the plain lock: a caller that waits for ever gives up
                    # on a server that stays away for a ttl, and on one that
                    # cannot even be connected to after the connect timeout.
                    limit = started + ttl if deadline is None else max(started + window, deadline)
                    if exc.connect_timeout is not None:
                        limit = min(limit, started + exc.connect_timeout)
                    if self._closed or loop.time() + delay >= limit:
                        raise
                    first = False  # it may have gone through
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX)
            if token >= 0:
                return Acquired(token)  # taken by this very request: the front's send time is earlier
            if not queue:
                return None
            # ``queued_at``: the send time of the last request the server
            # answered "still queued". A hand-over (by another client's
            # release, or by a script that found the holder expired) happens
            # after that request was served, hence after it was sent, and sets
            # the hold's expiry from that moment: counting the lease from this
            # send time is conservative, whichever way the news arrives.
            queued_at = sent
            failing_since: float | None = None
            while True:
                if ticket.token is not None:
                    if self._backend.replicas:
                        # Handed over by another client's release, which no
                        # replica has confirmed to us: a request of our own (it
                        # finds the hold ours and resets its expiry), then WAIT.
                        sent = loop.time()
                        token, _ = await self._enter(name, hold, ttl, True, handovers)
                        if token < 0:  # (gone meanwhile: expired)
                            raise BackendUnavailable("a hand-over expired before the replicas confirmed it")
                        return Acquired(token, confirmed_at=sent)
                    return Acquired(ticket.token, confirmed_at=queued_at)
                if self._closed:
                    raise BackendUnavailable("the Locks client was closed while this acquire was queued")
                if listener is not None and listener.failure is not None:
                    # The hand-over channel was refused: no message can reach this waiter.
                    raise ConfigurationError(str(listener.failure)) from listener.failure.__cause__
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return await self._leave(name, hold, queued_at)
                # Poll (which keeps the queue entry alive) every third of the
                # entry's lifetime; the head also when the holder's lease ends.
                pause = ttl / 3
                if hint >= 0:
                    pause = min(pause, hint / 1000 + 0.002)
                if failing_since is not None:
                    pause = min(pause, delay)
                if deadline is not None:
                    pause = min(pause, deadline - now)
                ticket.event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(pause, 0.001)):
                        await ticket.event.wait()
                if ticket.token is not None:
                    continue
                sent = loop.time()
                try:
                    token, hint = await self._enter(name, hold, ttl, True, handovers)
                except BackendUnavailable as exc:
                    # Our entry outlives a failing server for its ttl; past that it is
                    # gone anyway. A server that cannot even be connected to is given
                    # up on after the connect timeout.
                    failing_since = sent if failing_since is None else failing_since
                    if sent - queued_at >= ttl:
                        raise
                    if exc.connect_timeout is not None and sent - failing_since >= exc.connect_timeout:
                        raise
                    delay = 0.02 if failing_since == sent else min(delay * 2, RETRY_MAX)
                    hint = -2
                    continue
                failing_since = None
                if token >= 0:
                    return Acquired(token, confirmed_at=sent)  # this poll reset the hold's expiry
                queued_at = sent
        except _PermitsDiffer:
            raise  # the script changed nothing: nothing to give back
        except BaseException:
            # Cancelled, or failed: out of the queue, and a hand-over that raced
            # in is given back (which hands it to the next in line).
            if queue:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._give_back(name, hold, ttl))
            raise
        finally:
            handovers.forget(hold)
            self._tickets.discard(ticket)
            if me is not None:
                self._waiting.discard(me)

    async def _leave(self, name: str, hold: str, queued_at: float) -> Acquired | None:
        """Time is up: leave the queue, unless the lock was handed over meanwhile."""
        answer = await _call(
            self._release(keys=self._keys(name), args=[hold, self._permits, 1, FENCE_LIFETIME_MS]), self._backend
        )
        if int(answer[0]) == 2:
            return Acquired(int(answer[1]), confirmed_at=queued_at)
        return None

    async def _give_back(self, name: str, hold: str, ttl: float) -> None:
        """Release ``hold`` (and so leave the queue) after a failed or cancelled acquire.

        Runs shielded, possibly past its caller, for at most a ttl: its own
        errors end here (the entry and any hold it got expire by themselves
        within a ttl of the last request that reached the server).
        """
        try:
            async with asyncio.timeout(ttl):
                await self.release(name, hold)
        except (LockError, OSError, TimeoutError) as exc:
            logger.info("could not give back %r of %r, it expires by itself: %r", hold, name, exc)

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        done = await _call(self._set_count(keys=self._keys(name), args=[hold, count, _ms(ttl)]), self._backend)
        return bool(done)

    async def release(self, name: str, hold: str) -> bool:
        answer = await _call(
            self._release(keys=self._keys(name), args=[hold, self._permits, 0, FENCE_LIFETIME_MS]), self._backend
        )
        return int(answer[0]) == 1

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        results: list[bool | BaseException] = []
        for start in range(0, len(items), RENEW_CHUNK):
            chunk = items[start : start + RENEW_CHUNK]
            keys: list[str] = []
            args: list[str | int] = []
            for item in chunk:
                base = self.lock_key(item.name)
                keys += [base, f"{base}:data"]
                args += [item.hold, _ms(item.ttl)]
            try:
                if self._backend.replicas:
                    answer, confirmed = await self._backend._script_then_wait(self._renew, keys, args)
                    if confirmed < self._backend.replicas:
                        # Renewed on the primary only: not trusted; retried until the deadline.
                        error = BackendUnavailable(
                            f"only {confirmed} of {self._backend.replicas} replicas confirmed the renewal"
                        )
                        results += [error if flag else False for flag in answer]
                        continue
                else:
                    answer = await _call(self._renew(keys=keys, args=args), self._backend)
            except BackendUnavailable as exc:
                cause = exc.__cause__
                # A demoted primary: whatever it holds is not the lock any more.
                results += [False if cause is not None and _is_readonly(cause) else exc] * len(chunk)
                continue
            results += [bool(flag) for flag in answer]
        return results

    async def subscribe(self, name: str) -> None:
        """Not used: a hand-over message is addressed to its waiter's client."""

    async def unsubscribe(self, name: str) -> None:
        """Not used: a hand-over message is addressed to its waiter's client."""

    async def info(self, name: str) -> LockInfo:
        found, waiting = await _call(self._info(keys=self._keys(name)), self._backend)
        key = self.lock_key(name)
        holders: list[tuple[str, int, int, float]] = []
        for i in range(0, len(found), 3):
            hold = _text(found[i]) or ""
            parts = (_text(found[i + 1]) or "").split(" ")
            token = int(parts[1]) if len(parts) == 3 else 0
            count = int(parts[2]) if len(parts) == 3 else 1
            holders.append((hold, token, count, max(0, int(found[i + 2])) / 1000))
        if not holders:
            return LockInfo(name, key, None, 0, None, int(waiting), None)
        hold, token, count, left = holders[0]
        return LockInfo(name, key, hold, count, left, int(waiting), token, tuple(h[0] for h in holders))

    async def aclose(self) -> None:
        """Wake this adapter's queued acquires so they give up (the channel belongs to the backend)."""
        self._closed = True
        for ticket in self._tickets:
            ticket.event.set()
        # Let them leave the queue while the connection is still open (bounded:
        # an entry that cannot be removed expires by itself).
        waiting = [task for task in self._waiting if task is not asyncio.current_task()]
        if waiting:
            await asyncio.wait(waiting, timeout=1.0)
