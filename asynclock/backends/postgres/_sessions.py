"""The connections of one client's holds: a few sessions, each holding many locks.

Holds share sessions (PostgreSQL takes each advisory lock for a session, and
a session may hold any number), so a client holding a thousand locks needs
a few connections, not a thousand:

* At most ``max_leases`` sessions, opened as requests need them: a request
  takes the idle session used last (one session serves a client that does
  one thing at a time), else opens another while below the limit, else
  waits its turn on the session with the fewest requests waiting. A session
  runs one statement at a time, in the order they asked.
* A session's ``idle_session_timeout`` (PostgreSQL 14+) is the longest ttl
  of the holds it has had, so the server ends the session of a client that
  hangs, and every lock of it, a ttl after its last statement; the
  watchdog's pings (one per session, whatever its number of holds) keep it.
* A session that closes (``pg_terminate_backend``, a restart, the network)
  loses exactly its holds: ``on_lost`` is told.
* Each proves alive every hold on it with one ping (``ping``), whatever
  their number.
* Requests on the hot path are *watched*: one timer for all of them closes
  the session of a request unanswered by its bound, which fails the request
  and ends the session, with its locks. (Not ``_timing.Deadlines``, which
  cancels the waiting task: a statement cancelled in flight leaves its
  session, and whatever it locked, to a server that may not answer the
  cancel; and the watch costs a dict entry per request, no object.)
* A session without holds for ``PARK_TIME`` goes back to the pool with
  nothing of asynclock's left on it (one stays while the client has waiters:
  their tries run on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable

import asyncpg

from ..._timing import request_window
from ._errors import CLIENT_ERRORS, Translation
from ._hold import Session
from ._keys import app_name
from ._pool import Pool, is_closed, ms, terminate, unwrap
from ._sql import PING, SET_IDLE, SET_UP_SESSION

__all__ = ["PARK_TIME", "Sessions"]

logger = logging.getLogger("asynclock")

#: How long a session without holds stays with the client before it goes back to the pool, in seconds.
PARK_TIME = 0.5


class Sessions:
    """The sessions of one started backend's holds, from its pool.

    ``pg14``: the server has idle_session_timeout; ``on_lost(session)``: a
    session closed, with the holds it had; ``waiters()``: whether the client
    has waiters (then one session stays, for their tries).
    """

    def __init__(
        self,
        pool: Pool,
        errors: Translation,
        *,
        pg14: bool,
        backend: str,
        on_lost: Callable[[Session], None],
        waiters: Callable[[], bool],
    ) -> None:
        self._pool = pool
        self._errors = errors
        self.max_leases = pool.max_leases
        self.pg14 = pg14
        self._on_lost = on_lost
        self._waiters = waiters
        self.sessions: list[Session] = []
        self._opening = 0
        self._opened = asyncio.Event()  # set (and replaced) each time an opening ends
        #: The application_name of the sessions: the client's id (learned from its first hold) and the backend's.
        self.client = "?"
        self._backend = backend
        # Hot requests in flight: session -> loop time by which it must have answered.
        self.inflight: dict[Session, float] = {}
        self._watch: asyncio.TimerHandle | None = None
        self.watch_at = math.inf
        self._sweep: asyncio.TimerHandle | None = None
        #: The event loop of this client's requests (a client belongs to one loop): kept, since
        #: asking asyncio for the running one costs a system call.
        self.loop = asyncio.get_running_loop()

    def learn_client(self, hold: str) -> None:
        """Name the client in the sessions' application_name, from a hold id (the front's start with it)."""
        if self.client == "?":
            self.client = hold.partition(":")[0]

    # -- sessions -------------------------------------------------------------------

    def idle_session(self) -> Session | None:
        """The idle session used last, if any (no I/O)."""
        for session in reversed(self.sessions):
            if not session.busy:
                return session
        return None

    async def get(self, ttl: float) -> Session:
        """A session for a request: an idle one, a new one while below ``max_leases``, else the least queued."""
        while True:
            session = self.idle_session()
            if session is not None:
                return session
            if len(self.sessions) + self._opening < self.max_leases:
                return await self.open(ttl)
            if self.sessions:
                return min(self.sessions, key=lambda s: s.waiting)
            await self._opened.wait()  # every one is being opened: the first that is will do

    async def open(self, ttl: float) -> Session:
        """Open a session: its application_name and idle_session_timeout set, its closing watched.

        BackendUnavailable (or the edge's other errors) if that fails in time.
        """
        loop = self.loop
        bound = loop.time() + max(ttl - request_window(ttl), request_window(ttl))
        self._opening += 1
        try:
            proxy = await self._pool.checkout(bound)
            try:
                conn = unwrap(proxy)
                session = Session(proxy, conn, self._closed)
                idle = ms(ttl) if self.pg14 else None
                async with self._errors.edge, asyncio.timeout_at(max(bound, loop.time() + request_window(ttl))):
                    await conn.execute(SET_UP_SESSION, app_name(self.client, self._backend), idle)
            except BaseException:
                terminate(unwrap(proxy))
                raise
        finally:
            self._opening -= 1
            self._opened.set()
            self._opened = asyncio.Event()
        self._pool.silenced = False
        session.idle = ttl if self.pg14 else 0.0
        session.used_at = loop.time()
        conn.add_termination_listener(session.on_close)
        self.sessions.append(session)
        return session

    async def raise_idle(self, session: Session, ttl: float) -> None:
        """Make ``session``'s idle_session_timeout at least ``ttl`` (the caller has its turn)."""
        async with self._errors.edge, asyncio.timeout(request_window(ttl) + request_window(session.idle)):
            await session.conn.execute(SET_IDLE, ms(ttl))
        session.idle = ttl

    async def ping(self, session: Session) -> bool | BaseException:
        """Prove ``session`` alive with a round trip sent in its turn: True, False (it is gone), or
        the error to report (translated, the original as ``__cause__``)."""
        try:
            await session.enter()
            try:
                if session.gone or is_closed(session.conn):
                    return False
                await session.conn.fetchval(PING)
            finally:
                session.leave()
        except CLIENT_ERRORS as exc:
            if session.gone or is_closed(session.conn):
                return False
            translated = self._errors.translate(exc)
            translated.__cause__ = exc
            return translated
        return not session.gone

    def _closed(self, session: Session) -> None:
        session.gone = True
        if session in self.sessions:
            self.sessions.remove(session)
        self.inflight.pop(session, None)
        self._on_lost(session)

    def used(self, session: Session) -> None:
        """``session`` has no holds left: it goes back to the pool unless used again within ``PARK_TIME``."""
        session.used_at = self.loop.time()
        if self._sweep is None:
            self._sweep = self.loop.call_later(PARK_TIME, self._sweep_unused)

    def _sweep_unused(self) -> None:
        self._sweep = None
        now = self.loop.time()
        later = math.inf
        keep = self._waiters()
        for session in list(self.sessions):
            if session.holds or session.busy:
                continue
            if keep and len(self.sessions) == 1:
                later = min(later, now + PARK_TIME)  # the waiters' tries need it
                continue
            if now - session.used_at >= PARK_TIME:
                self.sessions.remove(session)
                self.retire(session)
            else:
                later = min(later, session.used_at + PARK_TIME)
        if later < math.inf:
            self._sweep = self.loop.call_at(later, self._sweep_unused)

    def retire(self, session: Session) -> None:
        """Give an unused session back to the pool (in the background)."""
        session.gone = True
        with contextlib.suppress(asyncpg.InterfaceError):
            session.conn.remove_termination_listener(session.on_close)
        self._pool.background.spawn(self._pool.give_back(session.proxy, session.idle > 0))

    # -- the watch on hot requests ----------------------------------------------------

    def watch(self, session: Session, deadline: float) -> None:
        """Watch a request on ``session``: unanswered by ``deadline`` (loop time), the session is closed.

        The caller calls ``unwatch`` once answered. A closed session fails the
        request (BackendUnavailable at the edge) and ends, with its locks.
        """
        self.inflight[session] = deadline
        if deadline < self.watch_at:
            if self._watch is not None:
                self._watch.cancel()
            self.watch_at = deadline
            self._watch = self.loop.call_at(deadline, self._check_inflight)

    def unwatch(self, session: Session) -> None:
        self.inflight.pop(session, None)

    def _check_inflight(self) -> None:
        self._watch, self.watch_at = None, math.inf
        now = self.loop.time()
        for session, deadline in list(self.inflight.items()):
            if deadline <= now:
                del self.inflight[session]
                logger.info("closing a PostgreSQL session whose request went unanswered in time")
                session.silent = self._pool.silenced = True
                terminate(session.conn)
        if self.inflight:
            earliest = min(self.inflight.values())
            self.watch_at = earliest
            self._watch = self.loop.call_at(earliest, self._check_inflight)

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Give every session back (closing those still holding), in the background of the pool."""
        for timer in (self._watch, self._sweep):
            if timer is not None:
                timer.cancel()
        self._watch = self._sweep = None
        self.watch_at = math.inf
        for session in self.sessions:
            if session.holds or session.busy:
                session.gone = True
                terminate(session.conn)  # holds the front could not end: closing the session ends them
            else:
                self.retire(session)
        self.sessions.clear()
