"""A virtual clock for the running event loop: time jumps ahead whenever every task waits.

asyncio's loop asks its selector to sleep until the next timer is due when
nothing is ready to run. Under a virtual clock the loop first looks for I/O
without sleeping; if there is none, its clock moves to that timer instead,
so ``await asyncio.sleep(3600)`` returns at once and timers still fire in
the order of their deadlines. Everything that keeps time by the loop's clock
follows: ``asyncio.timeout``, anyio's cancel scopes, a lease's deadline and
watchdog, and the lock table of ``memory://``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["VirtualClock", "virtual_clock"]


class _LoopTime:
    """The clock of one loop: its own clock plus how far it has jumped (never less)."""

    def __init__(self, real: Callable[[], float]) -> None:
        self.real = real
        self.offset = 0.0
        self.clock: VirtualClock | None = None  # the clock making it jump now, if any

    def __call__(self) -> float:
        return self.real() + self.offset


#: The loops whose clock was made virtual at least once (their time stays ahead for good).
_TIMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTime] = weakref.WeakKeyDictionary()


class _JumpingSelector:
    """The loop's selector, except that waiting for a timer jumps to it when no I/O is ready."""

    def __init__(self, real: Any, time: _LoopTime) -> None:
        self._real = real
        self._time = time

    def select(self, timeout: float | None = None) -> Any:
        if timeout is None or timeout <= 0:
            return self._real.select(timeout)
        events = self._real.select(0)
        if events:
            return events
        self._time.offset += timeout  # the loop now finds its next timer due
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualClock:
    """The running loop's clock jumps ahead whenever every task waits (made by :func:`virtual_clock`).

    ``jumped`` is how many seconds it has skipped so far.
    """

    __slots__ = ("_jumped_before", "_loop", "_selector", "_time")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._time: _LoopTime | None = None
        self._selector: Any = None
        self._jumped_before = 0.0

    @property
    def jumped(self) -> float:
        """Seconds the loop's clock has skipped while this clock was on."""
        if self._time is None:
            return 0.0
        return self._time.offset - self._jumped_before

    def __enter__(self) -> VirtualClock:
        if self._loop is not None:
            raise RuntimeError("this virtual clock is on already")
        loop = asyncio.get_running_loop()
        real = getattr(loop, "_selector", None)
        if not isinstance(loop, asyncio.BaseEventLoop) or real is None or not hasattr(real, "select"):
            raise RuntimeError(f"virtual_clock() needs asyncio's selector event loop, not {type(loop).__name__}")
        time = _TIMES.get(loop)
        if time is None:
            time = _TIMES[loop] = _LoopTime(loop.time)
            # The loop reads its clock through ``self.time()``: this instance's attribute answers.
            loop.time = time  # type: ignore[method-assign]
        if time.clock is not None:
            raise RuntimeError("the running loop has a virtual clock on already")
        time.clock = self
        self._loop, self._time, self._selector = loop, time, real
        self._jumped_before = time.offset
        loop._selector = _JumpingSelector(real, time)  # type: ignore[attr-defined]
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        loop, time = self._loop, self._time
        if loop is None or time is None:
            return
        if asyncio.get_running_loop() is not loop:
            raise RuntimeError("a virtual clock must be turned off in the loop it was turned on in")
        if getattr(loop, "_selector", None) is not None:  # (None once the loop is closed)
            loop._selector = self._selector  # type: ignore[attr-defined]
        time.clock = None
        self._loop = self._selector = None
        # The loop's clock keeps the time it jumped: a clock that went back would
        # put every timer set meanwhile far into the future.

    async def __aenter__(self) -> VirtualClock:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def virtual_clock() -> VirtualClock:
    """Make the running loop's time jump ahead whenever every task waits: for ``memory://`` only.

    Inside ``async with virtual_clock():`` (or ``with``), when no task can
    run and no I/O is ready, the loop's clock jumps to its next timer instead
    of sleeping, so ``await asyncio.sleep(3600)``, a 30 s ttl running out or
    a wait of ``acquire(timeout=60)`` take milliseconds of real time. Timers
    still fire in the order of their deadlines, and every wait that keeps
    time by the loop (``asyncio.timeout``, anyio's cancel scopes, a lease's
    deadline and watchdog) sees the same time.

    It is for tests against ``memory://``, whose lock table keeps time by the
    running loop's clock: a real lock server's clock does not jump, so its
    leases would expire at other times than the client believes. Real I/O
    and work in threads take real time, which the clock may jump past (a
    timeout around them fires at once): keep them out of the block, or use
    an in-process transport (``httpx.ASGITransport``) instead of a socket.

    On leaving the block the clock stops jumping but keeps the time it gained
    (it never runs backwards). It needs asyncio's own selector event loop;
    one clock per loop at a time. ``clock.jumped`` says how many seconds were
    skipped.

    Example::

        async with asynclock.testing.virtual_clock() as clock:
            await asyncio.sleep(3600)  # returns at once
            assert clock.jumped >= 3600
    """
    return VirtualClock()
