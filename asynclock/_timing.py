"""The few numbers every request and retry shares, in one place.

* A *request window* is the longest a single request may take before it
  counts as failed: a third of the lease time, at most a second.
* A failed request is retried after a :class:`Backoff`: 20 ms, doubling,
  at most a second.
* A lease's trusted deadline ends :func:`drift` before the server's.
* A request is bounded by :class:`Deadlines`, one timer for every request of a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

#: Longest time one request may take (capped at a third of the lease time).
REQUEST_WINDOW = 1.0
#: First and largest pause between retries of a request that failed to reach the server.
RETRY_FIRST = 0.02
RETRY_MAX = 1.0


def request_window(lease_time: float) -> float:
    """How long one request may take for a lease of ``lease_time`` seconds."""
    return min(lease_time / 3, REQUEST_WINDOW)


def drift(ttl: float) -> float:
    """Clock drift allowance for a lease of ``ttl`` seconds: 1 % plus 2 ms."""
    return ttl * 0.01 + 0.002


class Backoff:
    """Pauses between retries: ``first``, doubling, at most ``cap`` seconds."""

    __slots__ = ("_cap", "_first", "_next")

    def __init__(self, first: float = RETRY_FIRST, cap: float = RETRY_MAX) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def next(self) -> float:
        """The pause to take now; the following one is twice as long (up to the cap)."""
        pause = self._next
        self._next = min(pause * 2, self._cap)
        return pause

    def peek(self) -> float:
        """The pause ``next()`` would return, without moving on."""
        return self._next

    def reset(self) -> None:
        self._next = self._first


class Deadlines:
    """Bounds for many requests at once, with one loop timer.

    ``with deadlines.bound(when):`` is ``asyncio.timeout_at(when)`` for the
    requests of one client: when ``when`` passes, the task in the block is
    cancelled and the block raises TimeoutError. A timeout of its own would
    arm and cancel a timer per request; here one timer is armed for the
    earliest deadline and armed again, when it fires, for the next one, so a
    stream of requests that each end in time costs no timer at all.
    """

    __slots__ = ("_bounds", "_loop", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first request
        self._bounds: dict[_Bound, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def bound(self, when: float | None) -> _Bound | contextlib.nullcontext[None]:
        """A context manager that bounds its block by the loop time ``when`` (None: no bound)."""
        if when is None:
            return _NO_BOUND
        return _Bound(self, when)

    def _add(self, bound: _Bound, loop: asyncio.AbstractEventLoop) -> None:
        self._bounds[bound] = None
        if bound.when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._loop = loop
            self._timer_at = bound.when
            self._timer = loop.call_at(bound.when, self._fire)

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        self._timer_at = math.inf
        now = loop.time()
        earliest = math.inf
        for bound in self._bounds:
            if bound.when <= now:
                if not bound.expired:
                    bound.expired = True
                    bound.task.cancel()
            elif bound.when < earliest:
                earliest = bound.when
        if earliest < math.inf:
            self._timer_at = earliest
            self._timer = loop.call_at(earliest, self._fire)


class _Bound:
    __slots__ = ("_cancelling", "_deadlines", "expired", "task", "when")

    def __init__(self, deadlines: Deadlines, when: float) -> None:
        self._deadlines = deadlines
        self.when = when
        self.expired = False

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self._cancelling = task.cancelling()
        loop = task.get_loop()
        if self.when <= loop.time():
            self.expired = True
            task.cancel()  # as asyncio.timeout does: the first await raises
        self._deadlines._add(self, loop)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        del self._deadlines._bounds[self]
        if self.expired and self.task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


_NO_BOUND: contextlib.nullcontext[None] = contextlib.nullcontext()
