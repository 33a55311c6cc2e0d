"""The plain lock's table: one entry per held key, shared by every ``memory://`` client of the process."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass

from ...abc import Acquired, BackendHooks, Busy

__all__ = ["_TABLE", "_Entry", "_Table", "_clock"]


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

    def try_acquire_all(self, keys: list[str], holds: list[str], ttl: float) -> list[Acquired] | Busy:
        """Take every ``keys[i]`` for ``holds[i]`` if each is free (or held by that hold already), else none."""
        now = _clock()
        with self._mutex:
            for key, hold in zip(keys, holds, strict=True):
                entry = self._live(key, now)
                if entry is not None and entry.owner != hold:
                    return Busy(entry.expires_at - now)
            return [self.try_acquire_locked(key, hold, ttl, now) for key, hold in zip(keys, holds, strict=True)]

    def try_acquire_locked(self, key: str, hold: str, ttl: float, now: float) -> Acquired:
        """Take ``key``, free or held by ``hold`` (the caller holds the mutex and checked)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(hold, 1, next(self._tokens), now + ttl)
        else:
            entry.expires_at = now + ttl
        return Acquired(entry.token)

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
