"""What the client knows of one acquisition (``Hold``), of a key it asks for (``KeyState``)
and its line of waiters (``Line``, waited for as ``_lines`` says), and of a session holding
the locks of many (``Session``).

MySQL takes each named lock for a session, and a session may take a name it
holds again (the server counts it). The client therefore holds each key at
most once, on one session: a second owner of the same client is kept apart
here (its request is known to be busy without asking the server), and
requests about one key run one at a time (``KeyState``'s turns), so that no
session is ever asked for a key it holds already.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...abc import LockRef
from .._turns import Turns

__all__ = ["Hold", "KeyState", "Line", "Session", "Taker", "first_waiting"]


class Session(Turns):
    """One connection that holds locks for many holds of one client, one statement at a time (its turns).

    A session either holds locks (``holds``, proven alive by a ping every
    ttl/3), or waits in ``GET_LOCK`` for one line of waiters (``waiting``:
    such a session has no holds, so that nothing waits for it meanwhile).
    """

    __slots__ = ("conn", "cursor", "gone", "holds", "id", "killing", "silent", "timeout", "used_at", "waiting")

    def __init__(self, conn: Any, connection_id: int, timeout: int) -> None:
        super().__init__()
        self.conn = conn
        self.cursor = conn.cursor()
        #: the server's CONNECTION_ID() of the session (what IS_USED_LOCK names)
        self.id = connection_id
        #: its wait_timeout, in seconds: the server ends it after this long without a request
        self.timeout = timeout
        #: the holds whose locks it holds
        self.holds: set[Hold] = set()
        self.used_at = 0.0
        #: closed (by us, the server, or the network): nothing of this client's is on it any more
        self.gone = False
        #: a blocking GET_LOCK for a line of waiters is in flight, or about to be
        self.waiting = False
        #: closed because a request went unanswered in time
        self.silent = False
        #: a KILL QUERY of its wait is on its way (done once the server took it): the statements
        #: sent after its wait wait for it, so that it ends no other statement than the wait
        self.killing: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        state = " waiting" if self.waiting else (" busy" if self.busy else "")
        return f"<Session {self.id} holds={len(self.holds)}{state}{' gone' if self.gone else ''}>"

    @property
    def queued(self) -> int:
        """Requests waiting for their turn."""
        return len(self._next)


class KeyState(Turns):
    """One key as this client holds and waits for it: a lock's, an election's, or a semaphore's
    base (``slots`` its slot keys). Its turns are this client's requests about the key."""

    __slots__ = ("holders", "key", "line", "marker", "slots", "term")

    def __init__(self, key: str, marker: str, slots: tuple[str, ...] = (), term: str | None = None) -> None:
        super().__init__()
        self.key = key
        self.marker = marker
        self.slots = slots
        #: an election's term key (its leader holds it with the election's key)
        self.term = term
        #: local holds that hold it (a semaphore: one per slot taken)
        self.holders: dict[str, Hold] = {}
        #: the local waiters, and the sessions waiting in the server for them (None: nobody waits)
        self.line: Line | None = None

    def __repr__(self) -> str:
        return f"<KeyState {self.key!r} holders={len(self.holders)} line={self.line!r}>"

    @property
    def idle(self) -> bool:
        """Nothing here any more: the state can be forgotten."""
        return not (self.busy or self.holders or (self.line is not None and self.line.active))


@dataclass(eq=False, slots=True)
class Hold:
    """One acquisition: trying, queued, or holding."""

    ref: LockRef
    hold: str
    ttl: float
    state: KeyState
    #: the session whose lock this hold is, and the key it holds there (a semaphore: its slot's)
    session: Session | None = None
    key: str = ""
    granted: bool = False
    token: int | None = None
    lost: bool = False
    released: bool = False
    #: in its key's line, waiting for a grant
    queued: bool = False
    #: a request about it in flight (its try, its grant): its release waits for it
    pending: asyncio.Future[Any] | None = field(default=None, repr=False)
    #: set (to the grant's send time) when a line grants it; or to the error that ended its wait
    granted_at: asyncio.Future[float] | None = field(default=None, repr=False)
    #: the election's term key, while this hold (its leader) holds it with the election's key
    term: str | None = None
    #: the hold count the front keeps (for ``info``)
    count: int = 1


def first_waiting(waiters: deque[Hold]) -> Hold | None:
    """The first hold of a line that still waits (those that left are skipped, and dropped)."""
    while waiters:
        record = waiters[0]
        if record.queued and not record.granted:
            return record
        waiters.popleft()
    return None


class Taker(Protocol):
    """How the waits of one kind of primitive take a key and hand it to a waiter."""

    async def wait_take(self, session: Session, key: str, head: Hold, chunk: float) -> int | None:
        """Wait up to ``chunk`` seconds on ``session`` for ``key``, taking it for ``head``: its token, or
        None (not taken). Raises ValueError for ``head`` alone (the key let go of already)."""

    async def hand(self, session: Session, key: str, record: Hold, head: Hold) -> None:
        """``key``, just taken on ``session`` for ``head``, goes to ``record``: one round trip on the
        session (naming ``record`` the holder where that differs), whose send time proves the hold."""

    async def let_go(self, session: Session, key: str, head: Hold) -> None:
        """Let go of ``key``, taken on ``session`` for ``head`` (and of what else ``wait_take`` took
        with it), when nobody in line takes it."""


class Line:
    """The local waiters of one key (first first), and the tasks waiting in the server for them, by key."""

    __slots__ = ("count", "taker", "waiters", "waits")

    def __init__(self, taker: Taker) -> None:
        self.taker = taker
        self.waiters: deque[Hold] = deque()
        #: how many of ``waiters`` still wait
        self.count = 0
        self.waits: dict[str, tuple[asyncio.Task[None], list[Session]]] = {}

    def __repr__(self) -> str:
        return f"<Line waiting={self.count} waits={len(self.waits)}>"

    @property
    def active(self) -> bool:
        return self.count > 0 or bool(self.waits)
