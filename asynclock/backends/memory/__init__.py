"""``memory://``: the lock table lives in this process, no server.

Same semantics as the Redis backend (ttl, watchdog, reentrancy, tokens,
loss, cancellation) for demos and for the tests of applications that use
asynclock. Every ``memory://`` client of a process shares one table, so two
clients contend like two processes. :func:`expire` takes a lease away behind
its holder's back, the way a test of an application simulates a lost lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import Sequence
from typing import Any

from ..._errors import BackendUnavailable
from ..._guarantees import TABLE
from ..._options import query_names, reject_unknown
from ..._values import Leader, LockInfo, LossReason
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from ._queues import _ALL_FAMILIES, _FAMILIES, _QUEUES, _PermitsDiffer, _queue_key, _Request
from ._table import _TABLE, _clock
from ._watch import _MemoryLeaderWatch

__all__ = ["Faults", "MemoryBackend", "expire", "expire_all", "lose_now"]


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

    scheme = "memory"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["memory"].words

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
        reject_unknown(query_names(url), (), "memory://")
        reject_unknown(options, (), "memory://", keywords=True)
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

    def acquires_many(self, refs: Sequence[LockRef]) -> bool:
        """Plain locks: every one in the process's one table."""
        return all(ref.kind == "lock" for ref in refs)

    async def try_acquire_many(
        self, refs: Sequence[LockRef], holds: Sequence[str], ttl: float
    ) -> list[Acquired] | Busy:
        """Every plain lock of ``refs`` in one step of the table, all or none."""
        await self._request()
        return _TABLE.try_acquire_all([self.lock_key(ref) for ref in refs], list(holds), ttl)

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

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Tell the holder's client at once (its body is cancelled), then release the lock from it,
        which wakes the waiters: they run after the holder's cancellation."""
        info = await self.info(ref)
        if info.owner is None or (owner is not None and info.owner != owner):
            return None
        for backend in list(_BACKENDS):
            backend._lost_here([info.owner], "the lock was broken (force-released by locks.break_lock)")
        return info if _TABLE.release(info.key, info.owner) else None

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: the identity its candidate gave, its token, the wall-clock time of its grant."""
        await self._request()
        return _QUEUES.leader(self.lock_key(ref))

    def observe(self, ref: LockRef) -> LeaderWatch:
        """Every change of the election's leader, published by the table as it happens."""
        return _MemoryLeaderWatch(self._request, self.lock_key(ref))

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
