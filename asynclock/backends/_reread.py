"""A leader watch that reads the leader again whenever it may have changed.

Backends whose server tells observers *that* an election changed (a pub/sub
message, a notification) but not always *what* it changed to, and that
cannot hear of every change (a leader whose process died says nothing),
share one loop: wait until woken or until the last read said to look again,
then read. :class:`RereadWatch` is that loop; a backend gives it the read
and how to start and stop hearing of changes.
"""

from __future__ import annotations

import asyncio
import contextlib

from .._values import Leader

__all__ = ["RereadWatch"]


class RereadWatch:
    """``abc.LeaderWatch`` by reading again: after each :meth:`wake`, and when a read's own deadline passes.

    Subclasses implement :meth:`_join` (start hearing of changes, before the
    first read), :meth:`_leave` (stop, without I/O) and :meth:`_read` (the
    leader now, and in how many seconds to look again even if nothing
    wakes the watch; None: only when woken). Changes that begin and end
    between two reads are seen as one. A change announced as under way
    (:meth:`look_within`) is not read half done: the read waits for the
    news of its end, or a deadline.
    """

    def __init__(self) -> None:
        self._joined = False
        self._stale = True
        self._event: asyncio.Event | None = None
        self._again_at: float | None = None
        self._soon_at: float | None = None

    def wake(self) -> None:
        """Something changed, or news of a change may have been missed: read again."""
        self._stale = True
        if self._event is not None:
            self._event.set()

    def look_within(self, seconds: float) -> None:
        """A change is under way whose end wakes the watch (a leader handing over to the
        candidate in line): no read now, which would see it half done, but one ``seconds``
        from now if nothing woke the watch by then."""
        at = asyncio.get_running_loop().time() + seconds
        if self._soon_at is None or at < self._soon_at:
            self._soon_at = at
            if self._event is not None:
                self._event.set()  # (the wait takes the nearer deadline)

    async def next(self) -> Leader | None:
        """The leader after the next change (the current one on the first call)."""
        if self._event is None:
            self._event = asyncio.Event()
        if not self._joined:
            self._joined = True
            await self._join()
        loop = asyncio.get_running_loop()
        event = self._event
        while not self._stale:
            event.clear()
            again, soon = self._again_at, self._soon_at
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(again if soon is None or (again is not None and again < soon) else soon):
                    await event.wait()
            if not event.is_set():
                self._stale = True  # the read's deadline: a change nobody announces may have happened
        self._stale = False
        self._soon_at = None
        try:
            leader, again = await self._read()
        except BaseException:
            self._stale = True  # (the next call reads again)
            raise
        self._again_at = None if again is None else loop.time() + again
        return leader

    def close(self) -> None:
        """Stop watching (no I/O)."""
        if self._joined:
            self._joined = False
            self._leave()
        self._stale = True

    async def _join(self) -> None:
        raise NotImplementedError

    def _leave(self) -> None:
        raise NotImplementedError

    async def _read(self) -> tuple[Leader | None, float | None]:
        raise NotImplementedError
