"""Plain values handed to users: what ``info()`` and ``on_event`` give."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

EventKind = Literal["acquired", "released", "renewed", "lost", "timeout", "abandoned", "at_risk"]


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

    Example::

        def on_event(event: asynclock.LockEvent) -> None:
            if event.kind == "lost":
                log.error("lost %s: %s", event.name, event.reason)

        locks = asynclock.connect(url, on_event=on_event)
    """

    kind: EventKind
    """What happened: acquired, released, renewed, lost, timeout, abandoned or at_risk."""
    name: str
    """The lock's name."""
    owner: str
    """Who: ``<client id>:<owner>``, the owner being a task (``task-N``) or a detached lease."""
    token: int | None = None
    """The lease's fencing token, where there is one."""
    wait_s: float | None = None
    """Seconds from calling ``acquire`` to holding, or to timing out."""
    held_s: float | None = None
    """Seconds from holding to the release, loss or abandonment."""
    reason: str | None = None
    """Why a lease was lost or is at risk, in words."""
    loss: LossReason | None = None
    """Why a lease was lost, in a word."""
