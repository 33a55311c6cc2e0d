"""``memory://``: the lock table lives in this process, no server.

Same semantics as the Redis backend (ttl, watchdog, reentrancy, tokens,
loss, cancellation) for demos and for the tests of applications that use
asynclock. Every ``memory://`` client of a process shares one table, so two
clients contend like two processes. :func:`expire` takes a lease away behind
its holder's back, the way a test of an application simulates a lost lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import BackendUnavailable
from .._options import query_names, reject_unknown
from .._values import Leader, LockInfo, LossReason
from ..abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem

__all__ = ["Faults", "MemoryBackend", "expire", "expire_all", "lose_now"]


@dataclass(slots=True)
class _Entry:
    owner: str
    count: int
    token: int
    expires_at: float  # the loop's clock


class _Table:
    """The process-wide lock table; thread-safe so clients on several loops can share it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._tokens = itertools.count(1)
        self._subscribers: dict[str, dict[int, tuple[asyncio.AbstractEventLoop, BackendHooks, str]]] = {}

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= now:
            del self._entries[key]
            return None
        return entry

    def try_acquire(self, key: str, hold: str, ttl: float) -> Acquired | Busy:
        now = _clock()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None:
                entry = self._entries[key] = _Entry(hold, 1, next(self._tokens), now + ttl)
                return Acquired(entry.token)
            if entry.owner == hold:
                entry.expires_at = now + ttl
                return Acquired(entry.token)
            return Busy(entry.expires_at - now)

    def set_count(self, key: str, hold: str, count: int, ttl: float) -> bool:
        now = _clock()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None or entry.owner != hold:
                return False
            entry.count = count
            entry.expires_at = now + ttl
            return True

    def renew(self, key: str, hold: str, ttl: float) -> bool:
        now = _clock()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None or entry.owner != hold:
                return False
            entry.expires_at = now + ttl
            return True

    def release(self, key: str, hold: str) -> bool:
        now = _clock()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None or entry.owner != hold:
                return False
            del self._entries[key]
            subscribers = list(self._subscribers.get(key, {}).values())
        for loop, hooks, name in subscribers:
            _call(loop, hooks.wake_one, name)
        return True

    def expire(self, key: str) -> bool:
        """Drop ``key`` as if its ttl had run out (no release notification)."""
        return bool(self.take(key))

    def take(self, key: str) -> list[str]:
        """Drop ``key`` as if its ttl had run out; the hold it had (no release notification)."""
        with self._mutex:
            entry = self._entries.pop(key, None)
        return [] if entry is None else [entry.owner]

    def info(self, key: str) -> _Entry | None:
        with self._mutex:
            return self._live(key, _clock())

    def held_keys(self) -> list[str]:
        now = _clock()
        with self._mutex:
            return [key for key in list(self._entries) if self._live(key, now) is not None]

    def subscribe(self, key: str, client: int, loop: asyncio.AbstractEventLoop, hooks: BackendHooks, name: str) -> None:
        with self._mutex:
            self._subscribers.setdefault(key, {})[client] = (loop, hooks, name)

    def unsubscribe(self, key: str, client: int) -> None:
        with self._mutex:
            subscribers = self._subscribers.get(key)
            if subscribers is not None:
                subscribers.pop(client, None)
                if not subscribers:
                    del self._subscribers[key]


def _call(loop: asyncio.AbstractEventLoop, func: object, name: str) -> None:
    assert callable(func)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        func(name)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(func, name)


_TABLE = _Table()


def _clock() -> float:
    """The running loop's clock (``time.monotonic()`` on a standard loop; a test's virtual clock if it has one)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


# -- queued primitives: fair lock, read-write lock, semaphore, election ---------

#: The table family of each queued kind: the two sides of a read-write lock share one resource.
_FAMILIES = {"fair": "fair", "read": "rw", "write": "rw", "semaphore": "semaphore", "election": "election"}
#: Every family, for what acts on every primitive of a name.
_ALL_FAMILIES = ("fair", "rw", "semaphore", "election")


@dataclass(slots=True)
class _Holder:
    mode: str
    count: int
    token: int
    expires_at: float  # the loop's clock
    identity: str | None = None  # a candidate's (election)
    since: float = 0.0  # wall-clock time of the grant


@dataclass(slots=True, eq=False)
class _Request:
    hold: str
    mode: str
    ttl: float
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event
    token: int | None = None
    granted_at: float = 0.0  # the loop's clock
    identity: str | None = None


@dataclass(slots=True)
class _Resource:
    holders: dict[str, _Holder]
    queue: list[_Request]
    permits: int  # what the semaphore's first user asked for (1 for the other shapes)


class _PermitsDiffer(Exception):
    """A semaphore asked for with another ``permits`` than its current users'."""

    def __init__(self, permits: int) -> None:
        super().__init__(permits)
        self.permits = permits


class _QueueTable:
    """Resources whose waiters queue in FIFO order, granted here, under one mutex.

    The head of the queue is granted as soon as it is compatible with the
    holders; nobody behind it is granted before it (so a waiting writer keeps
    later readers out, and a fair lock is handed over in order). Expired
    holders are dropped whenever the resource is looked at; waiters look
    again when the earliest holder expires.

    An election's watches are told every change of its leader: each call
    that changes the holder publishes the new one, under the mutex, to every
    watch of that key, in order.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._resources: dict[str, _Resource] = {}
        self._tokens = itertools.count(1)
        self._watches: dict[str, weakref.WeakSet[_MemoryLeaderWatch]] = {}
        self._published: dict[str, Leader | None] = {}

    def _resource(self, key: str, permits: int) -> _Resource:
        res = self._resources.get(key)
        if res is None:
            res = self._resources[key] = _Resource({}, [], permits)
        return res

    @staticmethod
    def _fits(res: _Resource, mode: str, permits: int) -> bool:
        if mode == "x":
            return not res.holders
        if mode == "r":
            return all(holder.mode == "r" for holder in res.holders.values())
        return len(res.holders) < permits

    def _grant(self, key: str, res: _Resource, now: float, permits: int) -> None:
        """Drop expired holders and grant queued requests from the head, in order."""
        for hold in [hold for hold, holder in res.holders.items() if holder.expires_at <= now]:
            del res.holders[hold]
        while res.queue and self._fits(res, res.queue[0].mode, permits):
            req = res.queue.pop(0)
            req.token = next(self._tokens)
            req.granted_at = now
            res.holders[req.hold] = _Holder(req.mode, 1, req.token, now + req.ttl, req.identity, time.time())
            _wake(req)
        if not res.holders and not res.queue:
            del self._resources[key]
        if key in self._watches:
            self._publish(key)

    # -- an election's leader ------------------------------------------------------

    def _leader(self, key: str) -> tuple[Leader | None, float | None]:
        """The holder of ``key`` as a Leader, and when its hold expires (the loop's clock)."""
        res = self._resources.get(key)
        if res is None or not res.holders:
            return None, None
        holder = min(res.holders.values(), key=lambda h: h.token)
        return Leader(holder.identity or "", holder.token, holder.since), holder.expires_at

    def _publish(self, key: str) -> None:
        leader, expires_at = self._leader(key)
        if self._published.get(key, _UNSEEN) != leader:
            self._published[key] = leader
            for watch in list(self._watches.get(key, ())):
                watch._push(leader, expires_at)

    def watch(self, key: str, watch: _MemoryLeaderWatch) -> tuple[Leader | None, float | None]:
        """Tell ``watch`` every change of the leader of ``key`` from now on; the leader now."""
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)  # (tells the key's other watches, if it changes anything)
            leader, expires_at = self._leader(key)
            self._published.setdefault(key, leader)
            self._watches.setdefault(key, weakref.WeakSet()).add(watch)
            return leader, expires_at

    def unwatch(self, key: str, watch: _MemoryLeaderWatch) -> None:
        with self._mutex:
            watches = self._watches.get(key)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[key]
                    self._published.pop(key, None)

    def look(self, key: str) -> float | None:
        """Drop an expired leader of ``key`` (its watches hear of it); when the leader's hold expires now."""
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)
            if key in self._watches:
                self._publish(key)
            return self._leader(key)[1]

    def leader(self, key: str) -> Leader | None:
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)
            return self._leader(key)[0]

    def try_enter(self, key: str, req: _Request, permits: int, wait: bool) -> int | None:
        """Take it now (the token), or queue ``req`` when ``wait`` (None: not granted yet)."""
        now = _clock()
        with self._mutex:
            res = self._resource(key, permits)
            if res.permits != permits:
                raise _PermitsDiffer(res.permits)
            self._grant(key, res, now, permits)
            res = self._resource(key, permits)
            holder = res.holders.get(req.hold)
            if holder is not None:
                holder.expires_at = now + req.ttl
                return holder.token
            if not res.queue and self._fits(res, req.mode, permits):
                token = next(self._tokens)
                res.holders[req.hold] = _Holder(req.mode, 1, token, now + req.ttl, req.identity, time.time())
                if key in self._watches:
                    self._publish(key)
                return token
            if wait:
                res.queue.append(req)
            else:
                self._grant(key, res, now, permits)  # drops the resource if it is empty
            return None

    def poll(self, key: str, req: _Request, permits: int) -> tuple[int | None, float | None]:
        """(token if granted, seconds until the earliest holder expires)."""
        now = _clock()
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return req.token, None
            self._grant(key, res, now, permits)
            if req.token is not None:
                return req.token, None
            ends = [holder.expires_at for holder in res.holders.values()]
            return None, (min(ends) - now if ends else None)

    def leave(self, key: str, req: _Request, permits: int) -> int | None:
        """Stop waiting: out of the queue, or the token if it was granted meanwhile."""
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return req.token
            if req in res.queue:
                res.queue.remove(req)
            self._grant(key, res, _clock(), permits)  # those behind it may go now
            return req.token

    def update(self, key: str, hold: str, ttl: float, permits: int, count: int | None = None) -> bool:
        now = _clock()
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return False
            self._grant(key, res, now, permits)
            holder = res.holders.get(hold)
            if holder is None:
                return False
            holder.expires_at = now + ttl
            if count is not None:
                holder.count = count
            return True

    def release(self, key: str, hold: str, permits: int) -> bool:
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return False
            found = res.holders.pop(hold, None) is not None
            self._grant(key, res, _clock(), permits)
            return found

    def expire(self, key: str) -> bool:
        """Drop every holder of ``key`` (no hand-over until someone looks again)."""
        return bool(self.take(key))

    def take(self, key: str) -> list[str]:
        """Drop every holder of ``key`` (no hand-over until someone looks again); the holds it had."""
        with self._mutex:
            res = self._resources.get(key)
            if res is None or not res.holders:
                return []
            holds = list(res.holders)
            res.holders.clear()
            if key in self._watches:
                self._publish(key)
            return holds

    def snapshot(self, key: str, permits: int) -> tuple[list[tuple[str, _Holder]], int]:
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return [], 0
            self._grant(key, res, _clock(), permits)
            holders = sorted(res.holders.items(), key=lambda item: item[1].expires_at)
            return [(hold, _Holder(h.mode, h.count, h.token, h.expires_at, h.identity)) for hold, h in holders], len(
                res.queue
            )

    def held_keys(self) -> list[str]:
        now = _clock()
        with self._mutex:
            return [
                key
                for key, res in self._resources.items()
                if any(holder.expires_at > now for holder in res.holders.values())
            ]


def _wake(req: _Request) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is req.loop:
        req.event.set()
    elif not req.loop.is_closed():
        req.loop.call_soon_threadsafe(req.event.set)


_QUEUES = _QueueTable()
_UNSEEN = object()


class _MemoryLeaderWatch:
    """The changes of one election's leader, as the table publishes them (each one, in order)."""

    def __init__(self, backend: MemoryBackend, key: str) -> None:
        self._backend = backend
        self._key = key
        self._changes: collections.deque[tuple[Leader | None, float | None]] = collections.deque()
        self._expires_at: float | None = None
        self._watching = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def _push(self, leader: Leader | None, expires_at: float | None) -> None:
        """Called by the table, under its mutex, from any thread."""
        self._changes.append((leader, expires_at))
        event, loop = self._event, self._loop
        if event is None or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    async def next(self) -> Leader | None:
        await self._backend._request()
        if not self._watching:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
            self._watching = True
            leader, self._expires_at = _QUEUES.watch(self._key, self)
            return leader
        event = self._event
        assert event is not None
        loop = asyncio.get_running_loop()
        while not self._changes:
            event.clear()
            expires_at = self._expires_at
            # A leader that stops renewing is dropped only when somebody looks:
            # look when its hold expires (a renewal since then just moves that on).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(None if expires_at is None else max(expires_at, loop.time())):
                    await event.wait()
            if not self._changes and not event.is_set():
                self._expires_at = _QUEUES.look(self._key)
        leader, self._expires_at = self._changes.popleft()
        return leader

    def close(self) -> None:
        if self._watching:
            self._watching = False
            _QUEUES.unwatch(self._key, self)


def expire(name: str, *, prefix: str = "asynclock") -> bool:
    """Take the lock ``name`` away from its holder, as a server-side expiry would.

    For tests of applications: the holder's watchdog finds out at its next
    renewal and cancels the holder's ``async with`` body with ``LockLost``.
    Returns whether the lock was held.
    """
    return _TABLE.expire(f"{prefix}:{name}")


def expire_all(name: str, *, prefix: str = "asynclock") -> bool:
    """Like :func:`expire`, for every primitive of that name (fair lock, read-write lock, semaphore, election)."""
    dropped = [_QUEUES.expire(_queue_key(prefix, kind, name)) for kind in _ALL_FAMILIES]
    return _TABLE.expire(f"{prefix}:{name}") or any(dropped)


def _queue_key(prefix: str, kind: str, name: str) -> str:
    return f"{prefix}:{name}#{kind}"


def lose_now(name: str, *, prefix: str = "asynclock") -> bool:
    """Take every primitive of ``name`` away from its holders and tell their clients at once.

    Unlike :func:`expire` (found out at the next renewal), every client of
    this process that held it loses the lease now: its bodies are cancelled
    with ``LockLost``. Returns whether anything was held.
    """
    holds = _TABLE.take(f"{prefix}:{name}")
    for family in _ALL_FAMILIES:
        holds += _QUEUES.take(_queue_key(prefix, family, name))
    if holds:
        for backend in list(_BACKENDS):
            backend._lost_here(holds, f"lost by the test (faults.lose({name!r}))")
    return bool(holds)


class Faults:
    """What a test makes a ``memory://`` client suffer (``asynclock.testing.faults``)."""

    __slots__ = ("delay", "stalled_until", "unavailable")

    def __init__(self) -> None:
        #: seconds every request takes
        self.delay = 0.0
        #: loop time until which renewals hang (inf: until restored)
        self.stalled_until = 0.0
        #: every request raises BackendUnavailable
        self.unavailable = False


_BACKENDS: weakref.WeakSet[MemoryBackend] = weakref.WeakSet()


class MemoryBackend:
    """The in-process backend behind ``memory://``.

    The plain lock is a lock table entry whose release notifies this
    process's waiters; the fair lock, the read-write lock and the semaphore
    are FIFO queues granted in the table (a grant wakes its waiter directly).
    """

    kind = "memory"

    def __init__(self, *, prefix: str = "asynclock") -> None:
        self._prefix = prefix
        self._id = id(self)
        self._hooks: BackendHooks | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribed: set[str] = set()
        # queued requests of this client, by hold id, until granted and waited for, or left
        self._requests: dict[str, _Request] = {}
        self.faults = Faults()
        self._faults_changed: asyncio.Event | None = None
        _BACKENDS.add(self)

    def faults_changed(self) -> None:
        """The test changed ``faults``: requests that suffer them look again."""
        changed, loop = self._faults_changed, self._loop
        if changed is None or loop is None or loop.is_closed():
            return
        self._faults_changed = None  # the next wait waits for the next change
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            changed.set()
        else:
            loop.call_soon_threadsafe(changed.set)

    async def _request(self, renewal: bool = False) -> None:
        """Suffer the faults a test set: unavailable, a delay, hanging renewals."""
        faults = self.faults
        if faults.unavailable:
            raise BackendUnavailable("memory:// is unavailable (a test's fault: faults.unavailable())")
        if faults.delay:
            await asyncio.sleep(faults.delay)
        if renewal and faults.stalled_until:
            loop = asyncio.get_running_loop()
            while loop.time() < faults.stalled_until:
                # Woken when the test changes the faults (it may restore them, or stall longer).
                if self._faults_changed is None:
                    self._faults_changed = asyncio.Event()
                changed = self._faults_changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(faults.stalled_until if faults.stalled_until < math.inf else None):
                        await changed.wait()
            if faults.unavailable:
                raise BackendUnavailable("memory:// is unavailable (a test's fault: faults.unavailable())")

    def _lost_here(self, holds: list[str], reason: str) -> None:
        hooks, loop = self._hooks, self._loop
        if hooks is not None and loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                hooks.lose(holds, reason, LossReason.TAKEN_OR_EXPIRED)
            else:
                loop.call_soon_threadsafe(hooks.lose, holds, reason, LossReason.TAKEN_OR_EXPIRED)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "asynclock", **options: Any) -> MemoryBackend:
        """``memory://``: takes no options but the client's own (``ttl``, ``prefix``, ``connect_timeout``)."""
        reject_unknown([*query_names(url), *options], (), "memory://")
        return cls(prefix=prefix)

    def check_kind(self, kind: Kind) -> None:
        """Every primitive: the plain and fair lock, both sides of a read-write lock, the semaphore, elections."""

    def lock_key(self, ref: LockRef) -> str:
        if ref.kind == "lock":
            return f"{self._prefix}:{ref.name}"
        return _queue_key(self._prefix, _FAMILIES[ref.kind], ref.name)

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        self._loop = asyncio.get_running_loop()

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        await self._request()
        key = self.lock_key(ref)
        if ref.kind == "lock":
            return _TABLE.try_acquire(key, hold, ttl)
        req = _Request(hold, ref.mode, ttl, asyncio.get_running_loop(), asyncio.Event(), identity=ref.identity)
        try:
            token = _QUEUES.try_enter(key, req, ref.permits, wait=enqueue)
        except _PermitsDiffer as exc:
            raise ValueError(
                f"semaphore {ref.name!r} is in use with permits={exc.permits}, and this client asked for"
                f" permits={ref.permits}: every client of a semaphore must use the same number"
            ) from None
        if token is not None:
            return Acquired(token)
        if not enqueue:
            return Busy(None)
        self._requests[hold] = req
        return Queued(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        req = self._requests[hold]
        key = self.lock_key(ref)
        loop = asyncio.get_running_loop()
        while True:
            token, next_expiry = _QUEUES.poll(key, req, ref.permits)
            if token is not None:
                del self._requests[hold]
                return Acquired(token, confirmed_at=req.granted_at)
            wait = next_expiry  # a holder that expires may let this one in
            if until is not None:
                left = until - loop.time()
                if left <= 0:
                    return Queued(None)
                wait = left if wait is None else min(wait, left)
            req.event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if wait is None else max(wait, 0.001)):
                    await req.event.wait()

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        await self._request()
        if ref.kind == "lock":
            return _TABLE.set_count(self.lock_key(ref), hold, count, ttl)
        return _QUEUES.update(self.lock_key(ref), hold, ttl, ref.permits, count)

    async def release(self, ref: LockRef, hold: str) -> bool:
        await self._request()
        key = self.lock_key(ref)
        if ref.kind == "lock":
            return _TABLE.release(key, hold)
        req = self._requests.pop(hold, None)
        if req is not None and _QUEUES.leave(key, req, ref.permits) is None:
            return False  # it left the queue before being granted
        return _QUEUES.release(key, hold, ref.permits)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        await self._request(renewal=True)
        return [
            _TABLE.renew(self.lock_key(item.ref), item.hold, item.ttl)
            if item.ref.kind == "lock"
            else _QUEUES.update(self.lock_key(item.ref), item.hold, item.ttl, item.ref.permits)
            for item in items
        ]

    async def subscribe(self, name: str) -> None:
        assert self._hooks is not None
        self._subscribed.add(name)
        _TABLE.subscribe(self.lock_key(LockRef("lock", name)), self._id, asyncio.get_running_loop(), self._hooks, name)

    async def unsubscribe(self, name: str) -> None:
        self._subscribed.discard(name)
        _TABLE.unsubscribe(self.lock_key(LockRef("lock", name)), self._id)

    async def info(self, ref: LockRef) -> LockInfo:
        await self._request()
        key = self.lock_key(ref)
        if ref.kind != "lock":
            holders, waiting = _QUEUES.snapshot(key, ref.permits)
            if not holders:
                return LockInfo(ref.name, key, None, 0, None, waiting, None)
            hold, first = holders[0]
            return LockInfo(
                ref.name,
                key,
                hold,
                first.count,
                max(0.0, first.expires_at - _clock()),
                waiting,
                first.token,
                tuple(hold for hold, _ in holders),
            )
        entry = _TABLE.info(key)
        if entry is None:
            return LockInfo(ref.name, key, None, 0, None, None, None)
        return LockInfo(
            ref.name, key, entry.owner, entry.count, max(0.0, entry.expires_at - _clock()), None, entry.token
        )

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: the identity its candidate gave, its token, the wall-clock time of its grant."""
        await self._request()
        return _QUEUES.leader(self.lock_key(ref))

    def observe(self, ref: LockRef) -> LeaderWatch:
        """Every change of the election's leader, published by the table as it happens."""
        return _MemoryLeaderWatch(self, self.lock_key(ref))

    async def names(self) -> list[str]:
        """Names of the plain locks held under this client's prefix."""
        start = len(self._prefix) + 1
        return [key[start:] for key in _TABLE.held_keys() if key.startswith(self._prefix + ":")]

    async def aclose(self) -> None:
        for name in list(self._subscribed):
            await self.unsubscribe(name)
        for hold, req in list(self._requests.items()):
            # (a wait cancelled by the close gave its request back already)
            del self._requests[hold]
            req.event.set()
