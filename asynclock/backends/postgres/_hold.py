"""What the client knows of a key it asks for (``KeyState``), of one acquisition (``Hold``),
and of a session holding the locks of many (``Session``).

The client holds each advisory key at most once, on one session: a second
owner of the same client is kept apart here (its request is known to be
busy without asking the server), and the read holds of one client share its
one shared lock. Requests about one key run one at a time (``enter`` /
``leave``), so a request cut short (cancelled, or past its bound) leaves at
most one session whose locks are unknown (``unknown``); the next request on
the key, or the release of the cut-short hold, settles it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...abc import LockRef
from .._turns import Turns
from ._keys import Key, marker_key

__all__ = ["Hold", "KeyState", "Session"]


class Session(Turns):
    """One connection that holds locks for many holds of one client, one statement at a time (its turns)."""

    __slots__ = ("conn", "gone", "holds", "idle", "on_close", "pid", "proxy", "silent", "used_at")

    def __init__(self, proxy: Any, conn: Any, closed: Callable[[Session], None]) -> None:
        self.proxy = proxy  # what the pool lent (given back to it)
        self.conn = conn  # the connection itself: no proxy in the way of each request
        self.pid: int = conn.get_server_pid()
        super().__init__()
        #: idle_session_timeout in seconds (0: none set)
        self.idle = 0.0
        #: the holds whose locks it holds (a read group's members each)
        self.holds: set[Hold] = set()
        self.used_at = 0.0
        #: closed, or given back to the pool: nothing of this client's is on it any more
        self.gone = False
        #: its connection's termination listener: tells ``closed`` (the session's sessions) it closed
        self.on_close: Callable[[Any], None] = lambda _conn: closed(self)
        #: closed because a request went unanswered in time
        self.silent = False

    def __repr__(self) -> str:
        return f"<Session pid={self.pid} holds={len(self.holds)}{' busy' if self.busy else ''}>"

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._next)


class KeyState(Turns):
    """One advisory key (a lock, a read-write lock, or a semaphore's gate) as this client holds and waits for it.

    Its :class:`~asynclock.backends._turns.Turns` are this client's requests about the key, one at a time.
    """

    __slots__ = (
        "holders",
        "key",
        "marker",
        "session",
        "shared",
        "slots",
        "terms",
        "unknown",
        "waiting",
    )

    def __init__(self, key: Key, slots: frozenset[Key] = frozenset()) -> None:
        self.key = key
        #: a semaphore's slot keys (its key is the gate its waiters queue on)
        self.slots = slots
        self.marker = marker_key(key)
        super().__init__()
        #: the session holding the key for this client (locks, read-write locks), and in which mode
        self.session: Session | None = None
        self.shared = False
        #: local holds that hold it (a read group: several; a semaphore: one per permit)
        self.holders: dict[str, Hold] = {}
        #: local holds queued for it
        self.waiting = 0
        #: sessions on which a request cut short may have locked something no hold claims
        self.unknown: list[Session] = []
        #: an election's term keys taken by this client and not let go of by a resign (see ``_election``)
        self.terms: set[Key] = set()

    def __repr__(self) -> str:
        return f"<KeyState {self.key} holders={len(self.holders)} waiting={self.waiting}>"

    @property
    def idle(self) -> bool:
        """Nothing here any more: the state can be forgotten."""
        return not (self.busy or self.holders or self.waiting or self.unknown)

    def conflicts(self, shared: bool) -> bool:
        """Whether a hold of this client holds the key in a mode that keeps a ``shared`` (or exclusive) hold out."""
        return bool(self.holders) and not (shared and self.shared)


@dataclass(eq=False, slots=True)
class Hold:
    """One acquisition: trying, queued, or holding."""

    ref: LockRef
    hold: str
    ttl: float
    state: KeyState
    shared: bool
    #: the session whose lock this hold is (a read group's member: the group's session)
    session: Session | None = None
    #: a semaphore's slot key, and the permits key its client holds shared for it (on the listening session)
    slot: Key | None = None
    permits_key: Key | None = None
    granted: bool = False
    token: int | None = None
    count: int = 1
    lost: bool = False
    released: bool = False
    #: queued: its row's ticket, the listening session's incarnation that owns the row,
    #: whether it counts in the key's marker, whether it is first in line
    ticket: int | None = None
    incarnation: int = 0
    marked: bool = False
    head: bool = False
    #: set when a notification says to try now (``try_now``) or that it is first in line now
    woken: asyncio.Event | None = field(default=None, repr=False)
    try_now: bool = False
    #: the task putting its row in the queue (it outlives a caller that gives up)
    queuing: asyncio.Task[Any] | None = field(default=None, repr=False)
    #: a leader's term key (elections), while its row may be live
    term: Key | None = None
