"""The backend protocol, for people who write a backend.

A backend is a thin adapter. Everything that is the same for all backends
(owner identity, reentrancy bookkeeping, waiting with a timeout, cancel-safe
acquire, the lease watchdog, cancel-on-loss) lives in the front
(``asynclock._locks``) and in the one ``LeaseKeeper`` per client. A backend
only answers requests:

* ``try_acquire`` once, without waiting, for one *hold id* (a string unique to
  this acquisition). It must be idempotent for the same hold id: a retry
  after an ambiguous failure returns ``Acquired`` again if the first attempt
  went through. ``Busy.retry_after`` is how long the current holder's lease
  has left, the longest a waiter may sleep without a wake-up.
* Backends whose server queues waiters itself (ZooKeeper's sequential nodes,
  PostgreSQL's lock queue) set ``queues_waiters = True`` and implement
  ``wait_acquire`` instead of the try-and-notify pair: it waits in the
  server's queue until held (``Acquired``) or ``timeout`` (``None``). When the
  front cancels it, it must leave the queue (delete its node, cancel the
  server-side wait) before it returns; should it have got the lock anyway it
  returns ``Acquired`` and the front releases it.
* ``set_count`` records the hold count of a held lock (re-entry and inner
  releases); it must not create a lock that is not held.
* ``release`` gives up a hold completely, only if ``hold`` still holds it.
* ``renew`` extends many holds in as few round trips as it can.
* ``subscribe`` / ``unsubscribe`` manage release notifications for a name. When
  a release notification arrives the backend calls ``hub.wake_one(name)``;
  after it may have missed notifications (reconnect) it calls
  ``hub.wake_all()``.
* ``lease_time(ttl)`` is how long after a successful request was *sent* the
  server guarantees nobody else can get the lock.

More primitives than the plain lock (a fair lock, the two sides of a
read-write lock, a semaphore) are served by *adapters*: ``primitive(shape)``
returns an object with the same request methods as a backend (it is one,
for the front), speaking its own layout on the same connections. A handle of
each shape has its own keys, so a plain lock and a semaphore of the same name
are different things. The client calls ``start`` on an adapter (with hooks of
its own, so its wake-ups never reach waiters of another shape) before its
first request, and ``aclose`` on it before the backend's. Hold ids are unique
per client across every shape, so ``hooks.lose`` needs no shape. A backend
that lacks a shape raises ``NotImplementedError`` from ``primitive``, which
the front calls without I/O when the handle is made.

Every method translates its client library's errors into
``BackendUnavailable`` (or ``LockError``) at its edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ._values import LockInfo

__all__ = ["LOCK", "Acquired", "Backend", "BackendHooks", "Busy", "RenewItem", "Shape", "ShapeKind", "unsupported"]

#: ``"lock"`` is the plain lock (the backend itself); ``"read"`` and ``"write"``
#: are the two sides of one read-write lock.
ShapeKind = Literal["lock", "fair", "read", "write", "semaphore"]


@dataclass(frozen=True, slots=True)
class Shape:
    """Which primitive a handle is: its kind, and for a semaphore how many may hold it.

    Semantics every adapter keeps (the contract suite checks them):

    * ``fair``: holds are granted in the order the acquires reached the
      server; an acquire never takes the lock while older waiters are queued
      (not even ``timeout=0``); a release wakes only the head waiter. Such an
      adapter queues waiters (``queues_waiters = True``).
    * ``read`` / ``write`` of one name: any number of read holds or one write
      hold. A waiting writer keeps new readers out (no writer starvation).
      Both sides share one fencing counter, so a write's token is above every
      token handed out before it.
    * ``semaphore``: at most ``permits`` holds at once; each hold has its own
      fencing token and its own expiry, so a dead holder's permit comes back
      after its ttl.
    """

    kind: ShapeKind = "lock"
    permits: int = 1


#: The plain lock: served by the backend object itself.
LOCK = Shape()


@dataclass(frozen=True, slots=True)
class Acquired:
    """The lock is held; ``token`` is its fencing token or None.

    ``confirmed_at``: the ``loop.time()`` at which the request that proves the
    hold (for ZooKeeper the last acknowledged request of the session, for
    PostgreSQL the grant on the lease's connection) was *sent*; the lease's
    trusted deadline counts from it. None means the acquire request's own send
    time, measured by the front.
    """

    token: int | None
    confirmed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Busy:
    """Somebody else holds it; ``retry_after`` seconds is its remaining lease (None: unknown)."""

    retry_after: float | None


@dataclass(frozen=True, slots=True)
class RenewItem:
    """One hold that the watchdog wants renewed."""

    name: str
    hold: str
    ttl: float


class BackendHooks(Protocol):
    """What the client gives a backend so it can push news in."""

    def wake_one(self, name: str) -> None:
        """A release notification for ``name`` arrived: wake one local waiter."""

    def wake_all(self) -> None:
        """Notifications may have been missed: wake every local waiter to retry."""

    def lose(self, holds: Sequence[str] | None, reason: str) -> None:
        """These holds (None: every hold of this client) are lost, now."""


class Backend(Protocol):
    """The handful of primitives every backend implements."""

    #: URL scheme family, e.g. ``"redis"``; shown in ``repr`` and logs.
    kind: str
    #: True if the server queues waiters itself: the front calls ``wait_acquire``.
    queues_waiters: bool

    async def start(self, hooks: BackendHooks) -> None:
        """Connect (or check the connection) and start listener tasks."""

    def lock_key(self, name: str) -> str:
        """The backend's own name for the lock ``name`` (key, path, advisory key)."""

    def lease_time(self, ttl: float) -> float:
        """Seconds after a request's send time during which the hold is guaranteed."""

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        """Take the lock for ``hold`` if free (or already held by ``hold``)."""

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        """Queue-style backends only: wait in the server's queue; None on timeout."""

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        """Record ``count`` holds for ``hold``; False if ``hold`` no longer holds it."""

    async def release(self, name: str, hold: str) -> bool:
        """Release completely if ``hold`` holds it; False (and no change) otherwise."""

    async def renew(self, items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        """Renew each item: True renewed, False not the holder any more, or the error."""

    async def subscribe(self, name: str) -> None:
        """Start release notifications for ``name``; return once they are in effect."""

    async def unsubscribe(self, name: str) -> None:
        """Stop release notifications for ``name``."""

    async def info(self, name: str) -> LockInfo:
        """What the server knows about ``name``."""

    async def aclose(self) -> None:
        """Stop listeners and close what the backend opened (not what it was given)."""

    def primitive(self, shape: Shape) -> Backend:
        """The adapter serving ``shape`` (``LOCK``: the backend itself), without I/O.

        Raises ``NotImplementedError`` naming what the backend lacks.
        """


def unsupported(kind: str, shape: Shape, hint: str = "") -> NotImplementedError:
    """The error ``primitive`` raises for a shape the backend ``kind`` does not serve."""
    what = {
        "fair": "a fair lock",
        "read": "a read-write lock",
        "write": "a read-write lock",
        "semaphore": "a semaphore",
        "lock": "a lock",
    }[shape.kind]
    return NotImplementedError(f"the {kind} backend does not provide {what}" + (f"; {hint}" if hint else ""))
