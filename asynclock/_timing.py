"""The few numbers every request and retry shares, in one place.

* A *request window* is the longest a single request may take before it
  counts as failed: a third of the lease time, at most a second.
* A failed request is retried after a :class:`Backoff`: 20 ms, doubling,
  at most a second.
* A lease's trusted deadline ends :func:`drift` before the server's.
"""

from __future__ import annotations

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
