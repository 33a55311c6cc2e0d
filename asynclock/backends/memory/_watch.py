"""An election's leader as a ``memory://`` observer sees it: every change, in order."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable

from ..._values import Leader
from ._queues import _QUEUES

__all__ = ["_MemoryLeaderWatch"]


class _MemoryLeaderWatch:
    """The changes of one election's leader, as the table publishes them (each one, in order)."""

    def __init__(self, request: Callable[[], Awaitable[None]], key: str) -> None:
        # the backend's request gate (its injected faults apply to a watch's reads too)
        self._request = request
        self._key = key
        self._changes: collections.deque[tuple[Leader | None, float | None]] = collections.deque()
        self._expires_at: float | None = None
        self._watching = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def push(self, leader: Leader | None, expires_at: float | None) -> None:
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
        await self._request()
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
