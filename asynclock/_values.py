"""Plain values handed to users: what ``info()`` and ``on_event`` give."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

EventKind = Literal["acquired", "released", "renewed", "lost", "timeout", "abandoned", "at_risk", "ran", "skipped"]


class LossReason(enum.StrEnum):
    """Why a lease was lost, in a word (``LockEvent.loss``, ``LockLost.loss``); the text says more."""

    #: The server no longer has the hold: it expired there, or somebody took or deleted it.
    TAKEN_OR_EXPIRED = "taken_or_expired"
    #: The trusted deadline passed without a successful renewal.
    RENEWAL_FAILED = "renewal_failed"
    #: The session or connection that carried the hold ended.
    CONNECTION_LOST = "connection_lost"
    #: The client was closed while the lock was held.
    CLIENT_CLOSED = "client_closed"
    #: The hold lasted its handle's ``max_hold``: its body was cancelled and the lock released.
    MAX_HOLD = "max_hold"
    #: The client was closing (``aclose(drain=...)``) and the body did not end within the drain.
    CLOSING = "closing"


@dataclass(frozen=True, slots=True)
class Health:
    """What ``await locks.health()`` says of a client: for readiness and liveness probes.

    ``ok`` is whether a round trip to the backend succeeded within the
    client's connect timeout, ``latency`` how many seconds it took (None if
    it failed), ``held`` how many leases the client holds, ``at_risk`` how
    many of them have a failed renewal, and ``error`` why it is not ok (None
    when ok).
    """

    ok: bool
    """Whether the backend answered within the connect timeout."""
    latency: float | None
    """Seconds the round trip took; None if it failed."""
    held: int
    """Leases this client holds."""
    at_risk: int
    """Of them, how many have a failed renewal (their holders may be cancelled soon)."""
    error: str | None
    """Why it is not ok; None when ok."""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What the server says about one lock, as returned by ``await lock.info()``.

    ``key`` is the backend's own name for the lock (Redis key, znode path,
    advisory key) so that other tools can find it. ``owner`` is the holder's id
    (``None`` when free), ``ttl`` the remaining lease in seconds when the backend
    knows it, ``waiters`` the number of queued waiters when the backend knows it.
    A read lock or a semaphore can have several holders: ``holders`` lists them
    all, ``owner`` is one of them (the one whose lease ends first), and
    ``hold_count``, ``ttl`` and ``token`` are that holder's.
    """

    name: str
    """The lock's name."""
    key: str
    """The backend's own name for it: Redis key, znode path, advisory key, etcd key."""
    owner: str | None
    """The holder's id (``<client id>:<owner>`` for asynclock's holders), or None when free."""
    hold_count: int
    """How many times the holder holds it (re-entry), where the backend keeps it."""
    ttl: float | None
    """Seconds left on the holder's lease, where the backend knows it."""
    waiters: int | None
    """How many wait for it, where the backend knows it."""
    token: int | None
    """The holder's fencing token."""
    holders: tuple[str, ...] = ()
    """Every holder (several for a read lock or a semaphore)."""

    @property
    def held(self) -> bool:
        """Whether anybody holds the lock."""
        return self.owner is not None


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One thing that happened to a lock of this client, passed to ``on_event``.

    ``wait_s`` is set for ``acquired`` and ``timeout``, ``held_s`` for
    ``released``, ``lost`` and ``abandoned``; ``reason`` (text) for ``lost``
    and ``at_risk`` (a renewal failed, the lease is not lost yet), and ``loss``
    (a :class:`LossReason`) for ``lost``.

    A singleton job (``locks.singleton``) reports each call: ``ran`` when it
    ran here (``held_s``: how long the job took; ``reason``: why it did not
    finish, if it raised or was cut off by ``at_most``), ``skipped`` when
    another replica runs it or started it less than ``at_least`` seconds ago.

    Example::

        def on_event(event: asynclock.LockEvent) -> None:
            if event.kind == "lost":
                log.error("lost %s: %s", event.name, event.reason)

        locks = asynclock.connect(url, on_event=on_event)
    """

    kind: EventKind
    """What happened: acquired, released, renewed, lost, timeout, abandoned or at_risk;
    ran or skipped for a singleton job."""
    name: str
    """The lock's name."""
    owner: str
    """Who: ``<client id>:<owner>``, the owner being a task (``task-N``) or a detached lease."""
    token: int | None = None
    """The lease's fencing token, where there is one."""
    wait_s: float | None = None
    """Seconds from calling ``acquire`` to holding, or to timing out."""
    held_s: float | None = None
    """Seconds from holding to the release, loss or abandonment (for ``ran``: how long the job took)."""
    reason: str | None = None
    """Why a lease was lost or is at risk (or why a job that ran did not finish), in words."""
    loss: LossReason | None = None
    """Why a lease was lost, in a word."""


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election now, as ``await election.leader()`` and ``election.observe()`` give it.

    Two values are equal when they describe the same term.
    """

    identity: str
    """The leader's identity (the ``identity=`` of its ``locks.election(...)``, by default ``host:pid:task``;
    a Curator LeaderLatch's participant id on ZooKeeper, a Go Election's proposal on etcd)."""
    token: int | None
    """The fencing token of its term: strictly greater than every earlier term's of that election."""
    since: float | None
    """When the term began, in seconds since the epoch by the server's (memory: this process's) clock;
    None where the backend keeps no record of it (ZooKeeper, etcd, Redis)."""
