"""``memory://``: the lock table lives in this process, no server.

Same semantics as the Redis backend (ttl, watchdog, reentrancy, tokens,
loss, cancellation) for demos and for the tests of applications that use
asynclock. Every ``memory://`` client of a process shares one table, so two
clients contend like two processes. :func:`expire` takes a lease away behind
its holder's back, the way a test of an application simulates a lost lock.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .._values import LockInfo
from ..abc import Acquired, BackendHooks, Busy, RenewItem

__all__ = ["MemoryBackend", "expire"]


@dataclass(slots=True)
class _Entry:
    owner: str
    count: int
    token: int
    expires_at: float  # time.monotonic()


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
        now = time.monotonic()
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
        now = time.monotonic()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None or entry.owner != hold:
                return False
            entry.count = count
            entry.expires_at = now + ttl
            return True

    def renew(self, key: str, hold: str, ttl: float) -> bool:
        now = time.monotonic()
        with self._mutex:
            entry = self._live(key, now)
            if entry is None or entry.owner != hold:
                return False
            entry.expires_at = now + ttl
            return True

    def release(self, key: str, hold: str) -> bool:
        now = time.monotonic()
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
        with self._mutex:
            return self._entries.pop(key, None) is not None

    def info(self, key: str) -> _Entry | None:
        with self._mutex:
            return self._live(key, time.monotonic())

    def held_keys(self) -> list[str]:
        now = time.monotonic()
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


def expire(name: str, *, prefix: str = "asynclock") -> bool:
    """Take the lock ``name`` away from its holder, as a server-side expiry would.

    For tests of applications: the holder's watchdog finds out at its next
    renewal and cancels the holder's ``async with`` body with ``LockLost``.
    Returns whether the lock was held.
    """
    return _TABLE.expire(f"{prefix}:{name}")


class MemoryBackend:
    """The in-process backend behind ``memory://``."""

    kind = "memory"
    queues_waiters = False

    def __init__(self, *, prefix: str = "asynclock") -> None:
        self._prefix = prefix
        self._id = id(self)
        self._hooks: BackendHooks | None = None
        self._subscribed: set[str] = set()

    def lock_key(self, name: str) -> str:
        return f"{self._prefix}:{name}"

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        return _TABLE.try_acquire(self.lock_key(name), hold, ttl)

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        raise NotImplementedError("memory:// uses try_acquire and release notifications")

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        return _TABLE.set_count(self.lock_key(name), hold, count, ttl)

    async def release(self, name: str, hold: str) -> bool:
        return _TABLE.release(self.lock_key(name), hold)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return [_TABLE.renew(self.lock_key(item.name), item.hold, item.ttl) for item in items]

    async def subscribe(self, name: str) -> None:
        assert self._hooks is not None
        self._subscribed.add(name)
        _TABLE.subscribe(self.lock_key(name), self._id, asyncio.get_running_loop(), self._hooks, name)

    async def unsubscribe(self, name: str) -> None:
        self._subscribed.discard(name)
        _TABLE.unsubscribe(self.lock_key(name), self._id)

    async def info(self, name: str) -> LockInfo:
        entry = _TABLE.info(self.lock_key(name))
        if entry is None:
            return LockInfo(name, self.lock_key(name), None, 0, None, None, None)
        return LockInfo(
            name,
            self.lock_key(name),
            entry.owner,
            entry.count,
            max(0.0, entry.expires_at - time.monotonic()),
            None,
            entry.token,
        )

    async def names(self) -> list[str]:
        """Names of the locks held under this client's prefix."""
        start = len(self._prefix) + 1
        return [key[start:] for key in _TABLE.held_keys() if key.startswith(self._prefix + ":")]

    async def aclose(self) -> None:
        for name in list(self._subscribed):
            await self.unsubscribe(name)
