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
* Requests on the hot path are *watched*: one timer for all of them closes
  the session of a request unanswered by its bound, which fails the request
  and ends the session, with its locks.
* A session without holds for ``PARK_TIME`` goes back to the pool with
  nothing of asynclock's left on it (one stays while the client has waiters:
  their tries run on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import asyncpg

from ..._errors import BackendUnavailable
from ..._timing import request_window
from . import _sql
from ._errors import MapErrors
from ._keys import app_name
from ._turns import Turns

if TYPE_CHECKING:
    from ._hold import Hold

__all__ = ["ADMIN_TIMEOUT", "PARK_TIME", "Session", "Sessions", "is_closed", "ms", "terminate"]

logger = logging.getLogger("asynclock")

#: How long a session without holds stays with the client before it goes back to the pool, in seconds.
PARK_TIME = 0.5
#: Bound on short requests (set-up, info, a session's set-up), in seconds.
ADMIN_TIMEOUT = 10.0


def ms(seconds: float) -> str:
    """Seconds as a server setting's value in ms, rounded up and never 0 (0 would mean 'no limit')."""
    return str(max(1, math.ceil(seconds * 1000)))


def is_closed(conn: Any) -> bool:
    """Whether a connection is closed (a proxy the pool took back counts as closed)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def terminate(conn: Any) -> None:
    """Close a connection's socket now; its session, and every lock of it, ends with it."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Session(Turns):
    """One connection that holds locks for many holds of one client, one statement at a time (its turns)."""

    __slots__ = ("conn", "gone", "holds", "idle", "on_close", "pid", "proxy", "silent", "used_at")

    def __init__(self, proxy: Any, conn: Any) -> None:
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
        self.on_close: Callable[[Any], None] | None = None
        #: closed because a request went unanswered in time
        self.silent = False

    def __repr__(self) -> str:
        return f"<Session pid={self.pid} holds={len(self.holds)}{' busy' if self.busy else ''}>"

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._next)


class Sessions:
    """The sessions of one backend's holds, and the pool they come from."""

    def __init__(
        self, pool: Any, *, dsn: str | None, pool_options: dict[str, Any], max_leases: int, errors: MapErrors
    ) -> None:
        self.pool: Any = pool
        self.owns_pool = pool is None
        self._dsn = dsn
        self._pool_options = pool_options
        self.max_leases = max_leases
        self._errors = errors
        self.sessions: list[Session] = []
        self._opening = 0
        self._opened = asyncio.Event()  # set (and replaced) each time an opening ends
        #: Told when a session closed, with the holds it had.
        self.on_lost: Callable[[Session], None] = lambda session: None
        #: Whether the client has waiters: then one session stays, for their tries.
        self.waiters: Callable[[], bool] = lambda: False
        #: The application_name of the sessions (the client's id and the backend's).
        self.client = "?"
        self.backend = "?"
        #: PostgreSQL 14+: idle_session_timeout.
        self.pg14 = True
        # Hot requests in flight: session -> loop time by which it must have answered.
        self.inflight: dict[Session, float] = {}
        self._watch: asyncio.TimerHandle | None = None
        self.watch_at = math.inf
        self._sweep: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        #: The event loop of this client's requests (set by the first; a client belongs to one loop).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: A session was closed for not answering, and none has been opened since.
        self.silenced = False
        # Connections given back clean and not taken again: a checkout needs no connect.
        self._returned_clean = 0

    # -- the pool -----------------------------------------------------------------

    async def open_pool(self) -> None:
        """Create asynclock's own pool: ``max_leases`` sessions plus the listening one."""
        options = dict(self._pool_options)
        if "reset" in inspect.signature(asyncpg.create_pool).parameters:
            # Connections come back with GIVE_BACK run already: no RESET ALL round trip.
            options.setdefault("reset", _no_reset)
        async with self._errors, asyncio.timeout(ADMIN_TIMEOUT):
            self.pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=self.max_leases + 1, **options)

    async def checkout(self, bound: float) -> Any:
        """A connection of the pool by the loop time ``bound``.

        With a connection this backend gave back to the pool it is a plain
        ``acquire`` (no I/O as a rule). Otherwise the checkout, which may
        connect, runs in its own task: a caller that gives up leaves it to
        finish, and a connection it brings back goes straight back to the
        pool, so no half-made connection is left behind.
        """
        pool = self.pool
        if pool is None:
            raise self._errors.unavailable("the backend is closed")
        if self._returned_clean > 0:
            self._returned_clean -= 1
            with self._errors:
                return await pool.acquire()
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = loop.create_task(_acquire_from(pool))
        try:
            try:
                async with self._errors, asyncio.timeout_at(bound):
                    return await asyncio.shield(task)
            except BackendUnavailable as exc:
                if not isinstance(exc.__cause__, TimeoutError):
                    raise
                took = f"{loop.time() - started:.1f} s"
                if self.silenced:
                    # A session was closed for not answering: it is the server that went silent.
                    error = self._errors.unavailable(f"stopped answering (no connection within {took})")
                    error.retryable = False
                    raise error from exc.__cause__
                raise self._errors.unavailable(f"timed out after {took} getting a connection") from exc.__cause__
        except BaseException:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    self.spawn(pool.release(task.result()))
            else:
                task.add_done_callback(self._return_late_checkout)
            raise

    def _return_late_checkout(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None and self.pool is not None:
            self.spawn(self.pool.release(task.result()))

    async def give_back(self, proxy: Any) -> None:
        """Return a connection to the pool with nothing of asynclock's on it, else close it."""
        conn = getattr(proxy, "_con", None) or proxy
        try:
            async with asyncio.timeout(ADMIN_TIMEOUT):
                if not is_closed(conn):
                    await conn.execute(_sql.GIVE_BACK if self.pg14 else _sql.GIVE_BACK_PG13)
                await self.pool.release(proxy)
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL connection the pool did not take back clean: %r", exc)
            terminate(conn)
            return
        self._returned_clean += 1

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
        """Open a session: its application_name and idle_session_timeout set, its closing watched."""
        loop = asyncio.get_running_loop()
        bound = loop.time() + max(ttl - request_window(ttl), request_window(ttl))
        self._opening += 1
        try:
            proxy = await self.checkout(bound)
            try:
                conn = getattr(proxy, "_con", None) or proxy
                session = Session(proxy, conn)
                idle = ms(ttl) if self.pg14 else None
                async with self._errors, asyncio.timeout_at(max(bound, loop.time() + request_window(ttl))):
                    await conn.execute(_sql.SET_UP_SESSION, app_name(self.client, self.backend), idle)
            except BaseException:
                terminate(getattr(proxy, "_con", None) or proxy)
                raise
        finally:
            self._opening -= 1
            self._opened.set()
            self._opened = asyncio.Event()
        self.silenced = False
        session.idle = ttl if self.pg14 else 0.0
        session.used_at = loop.time()
        session.on_close = lambda _conn: self._closed(session)
        conn.add_termination_listener(session.on_close)
        self.sessions.append(session)
        return session

    async def raise_idle(self, session: Session, ttl: float) -> None:
        """Make ``session``'s idle_session_timeout at least ``ttl`` (the caller has its turn)."""
        async with self._errors, asyncio.timeout(request_window(ttl) + request_window(session.idle)):
            await session.conn.execute(_sql.SET_IDLE, ms(ttl))
        session.idle = ttl

    def _closed(self, session: Session) -> None:
        session.gone = True
        if session in self.sessions:
            self.sessions.remove(session)
        self.inflight.pop(session, None)
        self.on_lost(session)

    def used(self, session: Session) -> None:
        """``session`` has no holds left: it goes back to the pool unless used again within ``PARK_TIME``."""
        loop = self.loop or asyncio.get_running_loop()
        session.used_at = loop.time()
        if self._sweep is None:
            self._sweep = loop.call_later(PARK_TIME, self._sweep_unused)

    def _sweep_unused(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        later = math.inf
        keep = self.waiters()
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
            self._sweep = loop.call_at(later, self._sweep_unused)

    def retire(self, session: Session) -> None:
        """Give an unused session back to the pool (in the background)."""
        session.gone = True
        if session.on_close is not None:
            with contextlib.suppress(asyncpg.InterfaceError):
                session.conn.remove_termination_listener(session.on_close)
        self.spawn(self.give_back(session.proxy))

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
            self._watch = asyncio.get_running_loop().call_at(deadline, self._check_inflight)

    def unwatch(self, session: Session) -> None:
        self.inflight.pop(session, None)

    def _check_inflight(self) -> None:
        self._watch, self.watch_at = None, math.inf
        now = asyncio.get_running_loop().time()
        for session, deadline in list(self.inflight.items()):
            if deadline <= now:
                del self.inflight[session]
                logger.info("closing a PostgreSQL session whose request went unanswered in time")
                session.silent = self.silenced = True
                terminate(session.conn)
        if self.inflight:
            earliest = min(self.inflight.values())
            self.watch_at = earliest
            self._watch = asyncio.get_running_loop().call_at(earliest, self._check_inflight)

    # -- background and closing -------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, keeping a reference and retrieving its outcome."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve_outcome)
        return task

    async def aclose(self) -> None:
        """Give every session back (closing those still holding), then close the pool if it is asynclock's."""
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
        if self._background:
            await asyncio.wait(list(self._background), timeout=ADMIN_TIMEOUT)
        if self.owns_pool and self.pool is not None:
            pool, self.pool = self.pool, None
            if pool.get_size() > pool.get_idle_size():
                pool.terminate()  # something is still out: ending its session ends it
                return
            try:
                await asyncio.wait_for(pool.close(), timeout=ADMIN_TIMEOUT)
            except Exception:  # noqa: BLE001 - a silent server: drop the sockets
                pool.terminate()
        elif not self.owns_pool:
            self.pool = None


async def _no_reset(conn: Any) -> None:
    """Pool reset hook for asynclock's own pool: its connections come back clean already."""


async def _acquire_from(pool: Any) -> Any:
    """``pool.acquire()`` as a coroutine (it returns an awaitable context object)."""
    return await pool.acquire()
