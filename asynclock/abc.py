"""The backend protocol, for people who write a backend.

A backend answers single requests; everything else is written once in the
front: owner identity and re-entry, waiting with a deadline, retries with
backoff, give-back of an acquire cut short, the lease watchdog, loss →
cancellation. A request names what it is about with a :class:`LockRef`: the
kind of primitive, its name, and (semaphore) its permits.

Acquiring:

* ``try_acquire(ref, hold, ttl, enqueue=...)`` makes one request for the hold
  id ``hold`` (unique to this acquisition) and answers
  :class:`Acquired` (held now), :class:`Busy` (somebody else holds it; not
  queued) or, when ``enqueue`` is true and the server keeps a queue,
  :class:`Queued` (this hold waits in the server's queue). It must be
  idempotent for the same hold id: a retry after an ambiguous failure answers
  ``Acquired`` again if the first attempt went through.
* ``wait_queued(ref, hold, ttl, until)`` (queueing backends, :class:`Queues`)
  waits for a queued hold to be granted, at most until the loop time ``until`` (None: no
  limit), and answers ``Acquired`` or ``Queued`` (still waiting; the front
  calls again). It runs in the caller's task: when that task is cancelled the
  front releases the hold by identity afterwards, so the backend only has to
  leave nothing running.
* Backends that answer ``Busy`` implement :class:`Notifies`: the front
  subscribes to release notifications for the name before it waits, and the
  backend calls ``hooks.wake_one(name)`` when one arrives (``wake_all()``
  after it may have missed some).

Holding and releasing:

* ``release(ref, hold)`` gives up ``hold`` completely, only if it still holds
  it, and takes a queued hold out of the queue; True only if a hold was
  released. It is how the front gives back an acquire cut short, so it must
  accept a hold id the server never saw.
* ``renew(items)`` extends many holds in as few round trips as it can.
* ``set_count`` records the hold count of a held lock (re-entry and inner
  releases) for ``info``; it must not create a lock that is not held.
* ``lease_time(ttl)`` is how long after a successful request was *sent* the
  server guarantees nobody else can get the lock.
* ``hooks.lose(holds, reason)`` tells the client that holds are lost now
  (a session expired, a connection closed).

Leader election (the kind ``"election"``) is a capability: a backend that
offers it implements :class:`Elects` as well, and the front refuses
``locks.election(...)`` (NotImplementedError, no I/O) on one that does not.
A candidate is an ordinary hold of ``LockRef("election", name,
identity=...)``: queued FIFO like the fair lock, renewed by the watchdog,
released by ``release``; the backend keeps ``ref.identity`` with the hold,
so that ``leader(ref)`` and ``observe(ref)`` can tell who leads.

``check_kind(kind)`` raises ``NotImplementedError`` (see :func:`unsupported`)
for a primitive the backend lacks; the front calls it without I/O when a
handle is made. Each kind has its own keys, so a plain lock and a semaphore
of the same name are different things (except where ``lock_key`` says two
kinds are one lock, as the fair lock is the plain lock where that is FIFO).

Every method translates its client library's errors into
``BackendUnavailable``, ``ConfigurationError`` or ``LockError`` at its edge.

What a backend guarantees, as configured, is its ``guarantees`` (a class
attribute or a property): a frozenset of the words of
``asynclock.Locks.guarantees``, which ``connect(url, require=...)`` checks.
A backend without it guarantees none of them, as far as ``require`` goes.

Testing a backend: :mod:`asynclock.testing.conformance` is the contract
suite that asynclock's own backends pass, as a test class to subclass. A
backend's tests give it a ``Harness`` (how to connect a client,
``asynclock.Locks(backend, ...)``; how to expire a hold on the server; what
a test left behind there; whether it has fencing tokens) and run the same
tests (see that module's docs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ._values import Leader, LockInfo, LossReason

__all__ = [
    "AcquiresMany",
    "Acquired",
    "Backend",
    "BackendHooks",
    "Breaks",
    "Busy",
    "Elects",
    "Kind",
    "LeaderWatch",
    "Listable",
    "Located",
    "LockRef",
    "Notifies",
    "Queued",
    "Queues",
    "RenewItem",
    "unsupported",
]

#: The primitive a request is about. ``"lock"`` is the plain lock; ``"read"``
#: and ``"write"`` are the two sides of one read-write lock; ``"election"`` is
#: a candidate for leadership (see :class:`Elects`).
Kind = Literal["lock", "fair", "read", "write", "semaphore", "election"]


@dataclass(frozen=True, slots=True)
class LockRef:
    """What a request is about: the primitive's kind, its name, and for a semaphore the permits.

    Semantics every backend keeps (the contract suite checks them):

    * ``fair``: holds are granted in the order the acquires reached the
      server; an acquire never takes the lock while older waiters are queued
      (not even ``timeout=0``); a release wakes only the head waiter.
    * ``read`` / ``write`` of one name: any number of read holds or one write
      hold. A waiting writer keeps new readers out (no writer starvation).
      Both sides share one fencing counter.
    * ``semaphore``: at most ``permits`` holds at once; each hold has its own
      fencing token and its own expiry. Clients that ask for one name with
      different ``permits`` are refused with ``ValueError``.
    * ``election``: one holder (the leader) at a time, granted in the order
      the acquires reached the server, like ``fair``; each new leader's token
      is greater than every earlier leader's of that name. ``identity`` (the
      candidate's, set on every request of a candidate, None in ``leader`` and
      ``observe``) is kept with the hold for others to read. An election is
      a name space of its own: it never shares keys with a lock of that name.
    """

    kind: Kind
    name: str
    permits: int = 1
    identity: str | None = None

    @property
    def mode(self) -> Literal["x", "r", "s"]:
        """The request's mode on the server: exclusive, shared (read), or one of N."""
        if self.kind == "read":
            return "r"
        if self.kind == "semaphore":
            return "s"
        return "x"


@dataclass(frozen=True, slots=True)
class Acquired:
    """The lock is held; ``token`` is its fencing token or None.

    ``confirmed_at``: the ``loop.time()`` at which the request that proves the
    hold (for ZooKeeper the last acknowledged request of the session, for a
    hand-over the last request the server answered "still queued") was
    *sent*; the lease's trusted deadline counts from it. None means the
    acquire request's own send time, measured by the front.
    """

    token: int | None
    confirmed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Busy:
    """Somebody else holds it and this hold is not queued.

    ``retry_after`` seconds is the holder's remaining lease (None: unknown),
    the longest a waiter may sleep without a release notification.
    """

    retry_after: float | None


@dataclass(frozen=True, slots=True)
class Queued:
    """This hold waits in the server's queue; the front calls ``wait_queued``.

    ``poll_after``: seconds after which the backend wants to be asked again
    (Redis keeps a queue entry alive by the waiter's polls); None: the entry
    lives as long as the session or connection, no polling needed.
    """

    poll_after: float | None = None


@dataclass(frozen=True, slots=True)
class RenewItem:
    """One hold that the watchdog wants renewed."""

    ref: LockRef
    hold: str
    ttl: float

    @property
    def name(self) -> str:
        return self.ref.name


class BackendHooks(Protocol):
    """What the client gives a backend so it can push news in."""

    def wake_one(self, name: str) -> None:
        """A release notification for the plain lock ``name`` arrived: wake one local waiter."""

    def wake_all(self) -> None:
        """Notifications may have been missed: wake every local waiter to try again."""

    def lose(self, holds: Sequence[str] | None, reason: str, loss: LossReason = LossReason.CONNECTION_LOST) -> None:
        """These holds (None: every hold of this client) are lost, now."""

    def at_risk(self, holds: Sequence[str] | None, reason: str) -> None:
        """These holds (None: every hold of this client) may be lost soon (a session disconnected):
        the client tells their holders, who may checkpoint."""


class Backend(Protocol):
    """The requests every backend answers."""

    #: The URL scheme that names this backend, e.g. ``"redis"``; shown in ``repr`` and errors.
    scheme: str

    def check_kind(self, kind: Kind) -> None:
        """Raise ``NotImplementedError`` if this backend lacks the primitive ``kind``; no I/O."""

    def lock_key(self, ref: LockRef) -> str:
        """The backend's own name for the lock (key, path, advisory key)."""

    def lease_time(self, ttl: float) -> float:
        """Seconds after a request's send time during which the hold is guaranteed."""

    async def start(self, hooks: BackendHooks) -> None:
        """Connect (or check the connection) and start listener tasks."""

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        """Take the lock for ``hold`` if free (or already held by ``hold``), else queue it if ``enqueue``."""

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        """Record ``count`` holds for ``hold``; False if ``hold`` no longer holds it."""

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Release completely (or leave the queue) if ``hold`` holds it; False (and no change) otherwise."""

    async def renew(self, items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        """Renew each item: True renewed, False not the holder any more, or the error."""

    async def info(self, ref: LockRef) -> LockInfo:
        """What the server knows about the lock."""

    async def aclose(self) -> None:
        """Stop listeners and close what the backend opened (not what it was given)."""


class Queues(Protocol):
    """A backend whose server queues waiters: it may answer ``Queued``, and then waits here."""

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """Wait for a queued ``hold`` to be granted, at most until the loop time ``until``."""


@runtime_checkable
class Notifies(Protocol):
    """A backend that answers ``Busy`` and announces releases of the plain lock."""

    async def subscribe(self, name: str) -> None:
        """Start release notifications for ``name``; return once they are in effect."""

    async def unsubscribe(self, name: str) -> None:
        """Stop release notifications for ``name``."""


class LeaderWatch(Protocol):
    """What :meth:`Elects.observe` returns: the changes of one election's leader, read one at a time."""

    async def next(self) -> Leader | None:
        """The leader now (first call), then the leader after the next change; None while nobody leads.

        Waits without polling: for a server event, or until the current
        leader's hold expires if the server sends no event for that. It may
        return the same leader again (the front drops repeats), and must
        return every leader a change made when it can tell them apart (a
        backend that only learns the latest state after an event returns
        that). Runs in the caller's task and leaves nothing running when
        cancelled. Raises BackendUnavailable (or LockError) when the server
        cannot be asked; the front retries.
        """

    def close(self) -> None:
        """Forget what the watch registered; no I/O (a server-side watch left armed is harmless)."""


@runtime_checkable
class Elects(Protocol):
    """A backend that serves leader elections (``LockRef`` kind ``"election"``).

    Besides answering ``try_acquire``, ``wait_queued``, ``release``,
    ``renew`` and ``info`` for election refs (kept with ``ref.identity``), it
    tells who leads.
    """

    async def leader(self, ref: LockRef) -> Leader | None:
        """The current leader of the election ``ref.name`` (identity, token, since), or None; one read."""

    def observe(self, ref: LockRef) -> LeaderWatch:
        """A watch on the leader of the election ``ref.name``; no I/O until its first ``next()``."""


@runtime_checkable
class BoundsTtl(Protocol):
    """A backend whose holds share one lease of the client's (ZooKeeper's session, etcd's lease).

    A handle's ttl is checked against it when the handle is made: ``check_ttl``
    refuses, with ValueError and without I/O, a ttl the backend cannot carry.
    """

    def check_ttl(self, ttl: float) -> None:
        """Raise ValueError if holds of ``ttl`` seconds cannot be kept; no I/O."""


@runtime_checkable
class AcquiresMany(Protocol):
    """A backend that can take several plain locks in one request, all or none (``locks.multi``).

    The front asks it first, when every part is free for the asking: a
    multi-lock whose parts are free then costs one round trip. When one part
    is taken it takes none, and the front goes on part by part, in order.
    """

    def acquires_many(self, refs: Sequence[LockRef]) -> bool:
        """Whether :meth:`try_acquire_many` can take these together (one server, one slot); no I/O."""

    async def try_acquire_many(
        self, refs: Sequence[LockRef], holds: Sequence[str], ttl: float
    ) -> list[Acquired] | Busy:
        """Take every ``refs[i]`` for ``holds[i]`` if every one is free (or held by that very hold
        already: a retry), else take none and answer ``Busy``; never queues.

        Each part then is an ordinary hold of its plain lock, in the backend's
        own key, that ``release``, ``renew``, ``set_count`` and ``info`` serve
        as if ``try_acquire`` had taken it; a single lock of the same name, of
        any client, excludes it and is excluded by it. A lock with waiters
        queued counts as taken (the multi-lock does not jump their queue).
        """


@runtime_checkable
class Listable(Protocol):
    """A backend that can list the plain locks held under its prefix (``asynclock inspect``)."""

    async def names(self) -> list[str]:
        """Names of the plain locks held or waited for now; never one that nobody holds or waits for."""


@runtime_checkable
class Breaks(Protocol):
    """A backend whose plain locks an operator can force-release (``locks.break_lock``, ``asynclock break``)."""

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Release the plain lock ``ref.name`` whoever holds it: only if ``owner`` holds it, when
        given (an owner as ``info().owner`` shows it).

        The next holder's token must be larger than the broken hold's, and the
        broken holder must find out at its next renewal at the latest. Returns
        what the server said of the hold it broke; None when nobody (or not
        ``owner``) held it, or when the holder it read let go before the break
        (then the lock's next holder keeps it).
        """


@runtime_checkable
class Located(Protocol):
    """A backend that names its server in messages: a request the client's own time bound cut
    short says "<where> did not answer in time" (without it: "the <scheme> server")."""

    @property
    def where(self) -> str:
        """The server as messages name it, e.g. ``"Redis at 10.0.0.5:6379"``; never a password."""


_WHAT = {
    "fair": "a fair lock",
    "read": "a read-write lock",
    "write": "a read-write lock",
    "semaphore": "a semaphore",
    "lock": "a lock",
    "election": "leader election",
}


def unsupported(backend: str, kind: Kind, hint: str = "") -> NotImplementedError:
    """The error ``check_kind`` raises for a primitive the backend ``backend`` does not serve."""
    return NotImplementedError(f"the {backend} backend does not provide {_WHAT[kind]}" + (f"; {hint}" if hint else ""))
