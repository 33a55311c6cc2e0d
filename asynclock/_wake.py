"""WakeHub: the local side of release notifications.

Backends deliver "lock X was released" (pub/sub message, watch, NOTIFY) by
calling ``wake_one(name)``; the hub wakes exactly one local waiter of that
name, so one release never stampedes every task of the process. A waiter is
registered from the moment it subscribes until it leaves, and a wake-up that
arrives while it is busy trying is kept (its event stays set), so there is no
window in which a release can slip by unnoticed. A waiter that leaves with an
unconsumed wake-up passes it on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, LockError, plain
from ._values import LossReason

if TYPE_CHECKING:
    from .abc import Notifies

logger = logging.getLogger("asynclock")


class Waiter:
    """One task waiting for a release of one name."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def clear(self) -> None:
        """Forget earlier wake-ups; call right before each try."""
        self._event.clear()

    async def wait(self, timeout: float | None) -> None:
        """Return on a wake-up, or after ``timeout`` seconds (None: no limit)."""
        if timeout is None:
            await self._event.wait()
            return
        if self._event.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()


class _Entry:
    __slots__ = ("subscribed", "waiters")

    def __init__(self) -> None:
        self.waiters: list[Waiter] = []
        self.subscribed: asyncio.Task[None] | None = None


class WakeHub:
    """Fans release notifications out to local waiters, one per notification.

    It is the ``hooks`` object a backend gets: ``wake_one``, ``wake_all``, and
    ``lose``, which goes to the client's keeper.
    """

    def __init__(
        self,
        backend: Notifies | None,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        lose: Callable[[Sequence[str] | None, str, LossReason], None],
        at_risk: Callable[[Sequence[str] | None, str], None],
    ) -> None:
        self._backend = backend
        self._entries: dict[str, _Entry] = {}
        self._spawn = spawn
        self._lose = lose
        self._at_risk = at_risk

    def wake_one(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        for waiter in entry.waiters:
            if not waiter._event.is_set():
                waiter._event.set()
                return

    def wake_all(self) -> None:
        for entry in self._entries.values():
            for waiter in entry.waiters:
                waiter._event.set()

    def lose(self, holds: Sequence[str] | None, reason: str, loss: LossReason = LossReason.CONNECTION_LOST) -> None:
        """These holds (None: all of the client's) are lost, now."""
        self._lose(holds, reason, loss)

    def at_risk(self, holds: Sequence[str] | None, reason: str) -> None:
        """These holds (None: all of the client's) may be lost soon (e.g. the session is disconnected)."""
        self._at_risk(holds, reason)

    def subscribed(self, name: str) -> bool:
        """Whether release notifications for ``name`` are in effect right now."""
        entry = self._entries.get(name)
        return (
            entry is not None
            and entry.subscribed is not None
            and entry.subscribed.done()
            and not entry.subscribed.cancelled()
        )

    def waiting(self, name: str) -> int:
        entry = self._entries.get(name)
        return len(entry.waiters) if entry else 0

    def waiters(self) -> dict[str, int]:
        """How many local waiters each name has now (names with none are left out)."""
        return {name: len(entry.waiters) for name, entry in self._entries.items() if entry.waiters}

    @contextlib.asynccontextmanager
    async def watch(self, name: str) -> AsyncIterator[Waiter]:
        """Register a waiter for ``name``; returns once notifications are in effect."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry()
        waiter = Waiter()
        entry.waiters.append(waiter)
        try:
            if entry.subscribed is None:
                entry.subscribed = asyncio.get_running_loop().create_task(self._subscribe(name))
            await asyncio.shield(entry.subscribed)
            yield waiter
        finally:
            entry.waiters.remove(waiter)
            if waiter._event.is_set():
                self.wake_one(name)  # pass an unconsumed wake-up on
            if not entry.waiters and self._entries.get(name) is entry:
                del self._entries[name]
                self._spawn(self._unsubscribe(name, entry))

    async def _subscribe(self, name: str) -> None:
        assert self._backend is not None, "a backend that never answers Busy has no release notifications"
        try:
            await self._backend.subscribe(name)
        except ConfigurationError:
            raise  # no retry can fix it: the waiters raise it
        except (LockError, OSError) as exc:
            # The backend keeps the name in its wanted set and re-subscribes
            # when it reconnects (then wakes everyone); until then waiters are
            # bounded by the holder's remaining lease.
            logger.info("subscribe for %r failed, relying on lease bounds: %s", name, plain(exc))

    async def _unsubscribe(self, name: str, entry: _Entry) -> None:
        if entry.subscribed is not None and not entry.subscribed.done():
            with contextlib.suppress(BaseException):
                await entry.subscribed
        if name in self._entries or self._backend is None:
            return  # a new waiter came; its entry subscribed again
        try:
            await self._backend.unsubscribe(name)
        except (LockError, OSError) as exc:
            logger.debug("unsubscribe for %r failed: %s", name, plain(exc))
