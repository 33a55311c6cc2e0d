"""The connections of one client: a few sessions holding many locks, and a session per line of waiters.

Holds share sessions (MySQL takes each named lock for a session, and a
session may hold any number since MySQL 5.7.5 / MariaDB 10.0.2), so a client
holding a thousand locks needs a few connections, not a thousand:

* Holds take at most ``max_leases`` sessions, opened as requests need them:
  a request takes the idle session used last (one session serves a client
  that does one thing at a time), else opens another while below the limit,
  else waits its turn on the session with the fewest requests waiting. A
  session runs one statement at a time, in the order they asked.
* A line of waiters (``_lines``) waits in the server on a session of its
  own, one with no holds (nothing may wait behind a ``GET_LOCK`` that
  blocks): an idle one, else a new one. Once granted, that session holds
  the lock and serves requests like the others; it is why the sessions can
  outnumber ``max_leases`` while locks are contended.
* A session's ``wait_timeout`` is at least the longest ttl of the holds it
  has had (whole seconds, rounded up), so the server ends the session of a
  client that hangs or is cut off, and every lock of it, that long after
  its last request; the watchdog pings each session (not each hold) every
  ttl/3.
* A session that closes (``KILL``, a restart, the network) loses exactly its
  holds: ``on_lost`` is told, when its next request (a ping at the latest)
  finds it closed.
* A session without holds for ``PARK_TIME`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import asyncmy

from ..._errors import BackendUnavailable
from ..._timing import request_window
from .._background import Background
from ._config import Settings
from ._errors import CLIENT_ERRORS, Translation, code
from ._hold import Session
from ._sql import SET_TIMEOUT

__all__ = ["ADMIN_TIMEOUT", "PARK_TIME", "Sessions", "seconds"]

logger = logging.getLogger("asynclock")

#: How long a session without holds stays open after its last request, in seconds.
PARK_TIME = 0.5
#: Bound on short requests off the hot path (set-up, closing a session), in seconds.
ADMIN_TIMEOUT = 10.0


def seconds(ttl: float) -> int:
    """A ttl as a wait_timeout: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(ttl))


class Sessions:
    """The sessions of one started backend; ``on_lost(session)``: a session closed, with the holds it had."""

    def __init__(
        self,
        settings: Settings,
        errors: Translation,
        background: Background,
        *,
        max_leases: int,
        connect_timeout: float,
        on_lost: Callable[[Session], None],
    ) -> None:
        self._settings = settings
        self._errors = errors
        self._background = background
        self.max_leases = max_leases
        self._connect_timeout = connect_timeout
        self._on_lost = on_lost
        #: every open session: holding, idle, or waiting for a line
        self.sessions: list[Session] = []
        self._opening = 0
        self._opened = asyncio.Event()  # set (and replaced) each time an opening ends
        self._sweep: asyncio.TimerHandle | None = None
        self.closed = False
        self.loop = asyncio.get_running_loop()
        # Requests in flight: session -> loop time by which it must have answered (one timer for all).
        self.inflight: dict[Session, float] = {}
        self._watch: asyncio.TimerHandle | None = None
        self.watch_at = math.inf

    def __len__(self) -> int:
        return len(self.sessions)

    # -- choosing a session -----------------------------------------------------------

    def idle_session(self) -> Session | None:
        """The idle session used last that may hold more, if any (no I/O)."""
        for session in reversed(self.sessions):
            if not (session.busy or session.waiting or session.gone):
                return session
        return None

    async def get(self, ttl: float) -> Session:
        """A session for a hold's request: an idle one, a new one while below ``max_leases``, else
        the one with the fewest requests waiting."""
        while True:
            session = self.idle_session()
            if session is not None:
                return session
            holding = [s for s in self.sessions if not (s.waiting or s.gone)]
            if len(holding) + self._opening < self.max_leases:
                return await self.open(ttl)
            if holding:
                return min(holding, key=lambda s: s.queued)
            await self._opened.wait()  # every one is being opened: the first that is will do

    async def for_waiting(self, ttl: float) -> Session:
        """A session with no holds, marked ``waiting``, for a blocking ``GET_LOCK``: an idle one, else a new one."""
        for session in reversed(self.sessions):
            if not (session.busy or session.waiting or session.holds or session.gone):
                session.waiting = True
                return session
        session = await self.open(ttl, waiting=True)
        return session

    def done_waiting(self, session: Session) -> None:
        """``session`` waits for no line any more."""
        session.waiting = False
        if not session.holds:
            self.used(session)

    # -- opening, timeouts, pings ---------------------------------------------------------

    async def open(self, ttl: float, *, waiting: bool = False) -> Session:
        """Open a session with a wait_timeout for ``ttl``, within the connect timeout.

        The connecting runs in a task of its own: a caller that gives up
        leaves it to finish, and the session it opens is kept for the next
        request. BackendUnavailable (with ``connect_timeout`` set when no
        connection could be made) or ConfigurationError if it fails.
        """
        if self.closed:
            raise self._errors.unavailable("the backend is closed")
        self._opening += 1
        task = self.loop.create_task(self._connect(ttl))
        try:
            session = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._keep_late)
            raise
        finally:
            self._opening -= 1
            self._opened.set()
            self._opened = asyncio.Event()
        session.waiting = waiting
        return session

    def _keep_late(self, task: asyncio.Task[Session]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.used(task.result())

    async def _connect(self, ttl: float) -> Session:
        errors = self._errors
        timeout = self._connect_timeout
        try:
            async with asyncio.timeout(timeout):
                conn = await asyncmy.connect(**self._settings.connect_kwargs(timeout))
        except CLIENT_ERRORS as exc:
            translated = errors.translate(exc)
            if isinstance(translated, BackendUnavailable) and not _answered(exc):
                translated.connect_timeout = timeout  # nothing reached the server
            if translated is exc:
                raise
            raise translated from exc
        try:
            session = Session(conn, conn.thread_id(), seconds(ttl))
            async with errors.edge, asyncio.timeout(max(request_window(ttl), 1.0)):
                await session.cursor.execute(SET_TIMEOUT, (session.timeout,))
        except BaseException:
            conn.close()
            raise
        session.used_at = self.loop.time()
        if self.closed:
            conn.close()
            raise errors.unavailable("the backend is closed")
        self.sessions.append(session)
        return session

    async def ping(self, session: Session, ttl: float) -> bool | BaseException:
        """Prove ``session`` alive with a round trip sent in its turn: True, False (it is gone), or
        the error to report (translated, the original as ``__cause__``)."""
        if session.gone:
            return False
        await session.enter()
        try:
            if session.killing is not None:
                await asyncio.shield(session.killing)  # (the KILL QUERY meant for its wait goes first)
            if session.gone:
                return False
            # (bounded by the ttl, not a request window: the watchdog loses the holds by their
            # deadline first, and keeps trying until then, as for a server that is slow a moment)
            watch = self.loop.call_later(ttl, self.silence, session)
            try:
                await session.conn.ping(reconnect=False)
            finally:
                watch.cancel()
            session.used_at = self.loop.time()
        except CLIENT_ERRORS as exc:
            self.lost(session)
            translated = self._errors.translate(exc)
            if translated is exc:
                return exc
            translated.__cause__ = exc
            return translated
        finally:
            session.leave()
        return not session.gone

    # -- the watch on requests in flight --------------------------------------------------

    def watch(self, deadline: float) -> None:
        """Look at the requests in flight (``inflight``) at the loop time ``deadline``: a session whose
        request is unanswered by its own deadline then is closed (``silence``)."""
        if self._watch is not None:
            self._watch.cancel()
        self.watch_at = deadline
        self._watch = self.loop.call_at(deadline, self._check_inflight)

    def _check_inflight(self) -> None:
        self._watch, self.watch_at = None, math.inf
        now = self.loop.time()
        for session, deadline in list(self.inflight.items()):
            if deadline <= now:
                del self.inflight[session]
                self.silence(session)
        if self.inflight:
            self.watch(min(self.inflight.values()))

    def silence(self, session: Session) -> None:
        """A request on ``session`` went unanswered in time: close it (which fails the request, and
        ends the session on the server, with its locks, once the server notices)."""
        if not session.gone:
            logger.info("closing a MySQL session whose request went unanswered in time")
            session.silent = True
            session.conn.close()

    def lost(self, session: Session) -> None:
        """``session`` closed: forget it, and tell who held locks on it."""
        if session.gone:
            return
        session.gone = True
        with contextlib.suppress(Exception):
            session.conn.close()
        if session in self.sessions:
            self.sessions.remove(session)
        self._on_lost(session)

    # -- sessions without holds ---------------------------------------------------------

    def used(self, session: Session) -> None:
        """``session`` has no holds left: it is closed unless used again within ``PARK_TIME``."""
        session.used_at = self.loop.time()
        if self._sweep is None and not self.closed:
            self._sweep = self.loop.call_later(PARK_TIME, self._sweep_unused)

    def _sweep_unused(self) -> None:
        self._sweep = None
        now = self.loop.time()
        later = math.inf
        for session in list(self.sessions):
            if session.holds or session.busy or session.waiting:
                continue
            if now - session.used_at >= PARK_TIME:
                self.retire(session)
            else:
                later = min(later, session.used_at + PARK_TIME)
        if later < math.inf:
            self._sweep = self.loop.call_at(later, self._sweep_unused)

    def retire(self, session: Session) -> None:
        """Close an unused session (politely, in the background)."""
        session.gone = True
        if session in self.sessions:
            self.sessions.remove(session)
        self._background.spawn(_quit(session.conn))

    def close(self) -> None:
        """Close every session (those still holding at once: that ends their locks)."""
        self.closed = True
        for timer in (self._sweep, self._watch):
            if timer is not None:
                timer.cancel()
        self._sweep = self._watch = None
        self.watch_at = math.inf
        for session in list(self.sessions):
            if session.holds or session.busy or session.waiting:
                session.gone = True
                session.conn.close()
            else:
                self.retire(session)
        self.sessions.clear()

    def timeout_for(self, session: Session, ttl: float) -> int | None:
        """The wait_timeout ``session`` must be given before it holds for ``ttl`` (None: it has it).

        A session with holds only ever gets a longer one (every hold on it
        keeps its guarantee); one without holds gets exactly the ttl's, so
        that a dead holder's lock lasts its own ttl, not an earlier hold's.
        """
        wanted = seconds(ttl)
        if session.timeout < wanted or (session.timeout > wanted and not session.holds):
            return wanted
        return None


def _answered(exc: BaseException) -> bool:
    """Whether a failed connect got as far as a server that answered (and refused us)."""
    number = code(exc)
    return number is not None and number not in (2002, 2003, 2005)


async def _quit(conn: Any) -> None:
    try:
        async with asyncio.timeout(ADMIN_TIMEOUT):
            await conn.ensure_closed()
    except Exception:  # noqa: BLE001 - a server that does not answer a QUIT: drop the socket
        conn.close()
