"""Lease connections: checkout, parking, the watches on requests and waits, give-back.

A hold (or a waiting acquire) has a connection of its own for as long as it
lasts: its session holds the advisory lock. This module owns those
connections' life outside a statement:

* ``places`` bounds them: at most ``max_leases`` at once, so held locks
  never take all of an application's pool.
* A clean connection of asynclock's own pool, given back by a release, is
  *parked* for ``PARK_TIME`` (``PARK_MAX`` at most) so that the next acquire
  runs its try at once, with no pool hand-over; one timer sweeps them back.
* Requests on the hot path (a try, a release) are *watched*: one timer for
  all of them closes the connection of a request unanswered by its bound,
  which fails the request and ends the session with its locks.
* Waits in the server's queue are *probed*: while any runs, the server is
  asked for a ``SELECT 1`` on another connection every ttl; a server that
  does not answer gets the waiting connections closed, which ends the waits.
* A connection given back in an unknown state, or that cannot be cleaned
  in time, is closed instead: its session, and every lock of it, ends with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg

from ..._errors import BackendUnavailable
from ..._timing import request_window
from . import _sql
from ._errors import CLIENT_ERRORS, MapErrors

__all__ = ["PARK_MAX", "PARK_TIME", "LeaseConnections", "is_closed", "terminate"]

logger = logging.getLogger("asynclock")

#: How long a released lease connection of asynclock's own pool stays with the
#: backend for the next acquire before it goes back to the pool, in seconds,
#: and how many may.
PARK_TIME = 0.5
PARK_MAX = 4
#: Bound on short requests (info, probes, setup), in seconds.
ADMIN_TIMEOUT = 10.0
#: client_connection_check_interval of asynclock's connections, in ms: how soon
#: a waiter whose client is gone leaves the server's queue.
CHECK_INTERVAL_MS = 1000
#: A statement timeout for asyncpg that never fires first (our own bounds apply).
NO_COMMAND_TIMEOUT = 1e9


def is_closed(conn: Any) -> bool:
    """Whether a pool connection is closed (a proxy the pool took back after a close counts as closed)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def terminate(conn: Any) -> None:
    """Close a pool connection's socket now; its session, and every lock of it, ends with it."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    """Done callback: fetch a background task's exception so it is never reported as unretrieved."""
    if not task.cancelled():
        task.exception()


def cleanup_bound(ttl: float) -> float:
    """How long giving a connection back may take before it is closed instead."""
    return max(0.05, request_window(ttl))


class LeaseConnections:
    """The connections of one backend's holds and waits, and the pool they come from."""

    def __init__(
        self, pool: Any, *, dsn: str | None, pool_options: dict[str, Any], max_leases: int, errors: MapErrors
    ) -> None:
        self.pool: Any = pool
        self.owns_pool = pool is None
        self._dsn = dsn
        self._pool_options = pool_options
        self.max_leases = max_leases
        self._errors = errors
        self.places = asyncio.Semaphore(max_leases)
        # Every connection of the pool runs with client_connection_check_interval
        # already (asynclock's own pool sets it once per connection, on 14+).
        self.checked = False
        # asyncpg's own statement timeout for hot requests: none on asynclock's
        # own pool unless command_timeout was asked for; on a given pool one
        # that never fires first, so its command_timeout does not cut ours.
        self.hot_timeout: float | None = (
            None if pool is None and "command_timeout" not in pool_options else NO_COMMAND_TIMEOUT
        )
        # Lease connections given back to the pool clean and not taken again:
        # while there are some, a checkout most likely needs no connect.
        self._returned_clean = 0
        # (connection, when it goes back to the pool, clean-up bound), latest last.
        self._parked: list[tuple[Any, float, float]] = []
        self._sweep: asyncio.TimerHandle | None = None
        # Hot requests in flight: connection -> loop time by which it must have answered.
        self._inflight: dict[Any, float] = {}
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = math.inf
        # Connections waiting in the server's queue -> their lease time; the
        # ones the probe closed because the server stopped answering.
        self._waiting: dict[Any, float] = {}
        self.silenced: set[Any] = set()
        self._probe_timer: asyncio.TimerHandle | None = None
        self._probe: asyncio.Task[bool] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- the pool ---------------------------------------------------------------

    async def open_pool(self) -> None:
        """Create asynclock's own pool: ``max_leases`` lease connections plus one for info and probes."""
        options = dict(self._pool_options)
        if "reset" in inspect.signature(asyncpg.create_pool).parameters:
            # Lease connections undo their own settings and lock when they are
            # given back; the pool's RESET ALL round trip is not needed.
            options.setdefault("reset", _no_reset)
        options["init"] = _with_check_interval(options.get("init"))
        async with self._errors, asyncio.timeout(ADMIN_TIMEOUT):
            self.pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=self.max_leases + 1, **options)

    async def checkout(self, bound: float) -> Any:
        """A connection by the loop time ``bound``: a parked one, else one from the pool.

        With a connection this backend gave back to the pool it is a plain
        ``acquire`` (no I/O as a rule). Otherwise the checkout, which may
        connect, runs in its own task: a caller that gives up leaves it to
        finish, and a connection it brings back goes straight back to the
        pool, so no half-made connection is left behind.
        """
        conn = self.take_parked()
        if conn is not None:
            return conn
        pool = self.pool
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
                # (asyncpg's connect timeout, or our bound: either way, say how long it took)
                raise self._errors.unavailable(
                    f"timed out after {loop.time() - started:.1f} s getting a connection"
                ) from exc.__cause__
        except BaseException:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    self.spawn_background(pool.release(task.result()))
            else:
                task.add_done_callback(self._return_late_checkout)
            raise

    def _return_late_checkout(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.spawn_background(self.pool.release(task.result()))

    @contextlib.asynccontextmanager
    async def borrow(self, within: float = ADMIN_TIMEOUT) -> AsyncIterator[Any]:
        """A pool connection for one short request, all of it bounded by ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        conn = await self.checkout(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                yield conn
        finally:
            # Back to the pool even if the caller is cancelled meanwhile; the
            # pool waits for a cancelled statement to be acknowledged (or
            # closes the connection).
            self.spawn_background(self.pool.release(conn, timeout=max(0.05, min(within, ADMIN_TIMEOUT))))

    # -- parking ----------------------------------------------------------------

    def park(self, conn: Any, bound: float) -> None:
        """Keep a clean lease connection for the next acquire a moment, else give it back to the pool."""
        if not self.owns_pool or len(self._parked) >= PARK_MAX:
            self.spawn_background(self._return(conn, bound))
            return
        loop = asyncio.get_running_loop()
        self._parked.append((conn, loop.time() + PARK_TIME, bound))
        if self._sweep is None:
            self._sweep = loop.call_later(PARK_TIME, self._sweep_parked)

    def _sweep_parked(self) -> None:
        """Give the connections parked for ``PARK_TIME`` back to the pool; come back for the rest."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        keep = []
        for conn, until, bound in self._parked:
            if until <= now:
                self.spawn_background(self._return(conn, bound))
            else:
                keep.append((conn, until, bound))
        self._parked = keep
        if keep:  # the oldest goes first: every connection is parked for the same time
            self._sweep = asyncio.get_running_loop().call_at(keep[0][1], self._sweep_parked)

    def take_parked(self) -> Any:
        """A clean, open lease connection kept by ``park`` (the latest), or None."""
        while self._parked:
            conn = self._parked.pop()[0]
            if not is_closed(conn):
                return conn
            terminate(conn)  # closed while parked: the pool takes its holder back
        return None

    async def _return(self, conn: Any, bound: float) -> None:
        """Give a clean lease connection back to the pool (in the background)."""
        try:
            async with asyncio.timeout(bound):
                await self.pool.release(conn)
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection the pool did not take back: %r", exc)
            terminate(conn)
            return
        self._returned_clean += 1

    # -- giving back ------------------------------------------------------------

    async def release_statement(self, conn: Any, statement: str, args: tuple[Any, ...], ttl: float) -> bool:
        """Run a hold's one release statement, watched, then park the connection; False if it was closed."""
        bound = cleanup_bound(ttl)
        if is_closed(conn):
            terminate(conn)  # lets the pool take its holder back
            return False
        try:
            self.watch(conn, asyncio.get_running_loop().time() + bound)
            try:
                await conn.execute(statement, *args, timeout=self.hot_timeout)
            finally:
                self._inflight.pop(conn, None)
        except asyncio.CancelledError:
            terminate(conn)
            raise
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection in an unknown state: %r", exc)
            terminate(conn)
            return False
        if is_closed(conn):  # closed by the watch (or the server) meanwhile
            terminate(conn)
            return False
        self.park(conn, bound)
        return True

    async def give_back(
        self,
        conn: Any,
        statement: str | None,
        args: tuple[Any, ...],
        ttl: float,
        listener: tuple[str, Callable[..., None]] | None,
        *,
        park: bool = False,
    ) -> bool:
        """Return ``conn`` in a known state (``statement`` run, ``listener`` removed), else close it.

        It goes back to the pool, or with ``park`` is kept for the next
        acquire. True if it went back clean. Never raises but CancelledError,
        and a cancelled caller leaves the connection closed.
        """
        if listener is None and park and statement is not None:
            return await self.release_statement(conn, statement, args, ttl)
        if is_closed(conn):
            terminate(conn)
            return False
        bound = cleanup_bound(ttl)
        try:
            async with asyncio.timeout(bound):
                if listener is not None:
                    await conn.remove_listener(*listener)  # UNLISTEN, and the callback is gone
                if statement is not None:
                    await conn.execute(statement, *args)
                if not park:
                    await self.pool.release(conn)
        except asyncio.CancelledError:
            terminate(conn)
            raise
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection in an unknown state: %r", exc)
            terminate(conn)
            return False
        if park:
            self.park(conn, bound)
        else:
            self._returned_clean += 1
        return True

    # -- the watch on hot requests ----------------------------------------------

    def watch(self, conn: Any, deadline: float) -> None:
        """Watch a request on ``conn``: unanswered by ``deadline`` (loop time), the connection is closed.

        The caller calls ``unwatch`` once answered. A closed connection fails
        the request (BackendUnavailable at the edge) and ends the session.
        """
        self._inflight[conn] = deadline
        if deadline < self._watch_at:
            if self._watch is not None:
                self._watch.cancel()
            self._watch_at = deadline
            self._watch = asyncio.get_running_loop().call_at(deadline, self._check_inflight)

    def unwatch(self, conn: Any) -> None:
        self._inflight.pop(conn, None)

    def _check_inflight(self) -> None:
        """Close the connections of overdue requests; come back for the earliest other one."""
        self._watch, self._watch_at = None, math.inf
        now = asyncio.get_running_loop().time()
        for conn, deadline in list(self._inflight.items()):
            if deadline <= now:
                del self._inflight[conn]
                logger.info("closing a PostgreSQL connection whose request went unanswered in time")
                terminate(conn)
        if self._inflight:
            earliest = min(self._inflight.values())
            self._watch_at = earliest
            self._watch = asyncio.get_running_loop().call_at(earliest, self._check_inflight)

    # -- the probe of waits -----------------------------------------------------

    def wait_started(self, conn: Any, ttl: float) -> None:
        """A wait in the server's queue runs on ``conn``: probe the server every ttl while it does."""
        self._waiting[conn] = ttl
        self.silenced.discard(conn)
        if self._probe_timer is None:
            self._probe_timer = asyncio.get_running_loop().call_later(ttl, self._probe_waits)

    def wait_ended(self, conn: Any) -> None:
        self._waiting.pop(conn, None)
        if not self._waiting and self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None

    def _probe_waits(self) -> None:
        self._probe_timer = None
        if self._waiting:
            self.spawn_background(self._probe_then_end_waits(min(self._waiting.values())))

    async def _probe_then_end_waits(self, within: float) -> None:
        if not await self.server_alive(within):
            for conn in list(self._waiting):
                self.silenced.add(conn)
                terminate(conn)
        if self._waiting and self._probe_timer is None:
            self._probe_timer = asyncio.get_running_loop().call_later(min(self._waiting.values()), self._probe_waits)

    async def server_alive(self, within: float) -> bool:
        """One shared probe at a time: can a connection of the pool run ``SELECT 1`` within ``within``?"""
        task = self._probe
        if task is None or task.done():
            task = self._probe = asyncio.get_running_loop().create_task(self._probe_once(within))
        return await asyncio.shield(task)

    async def _probe_once(self, within: float) -> bool:
        try:
            async with self.borrow(within) as conn:
                await conn.fetchval(_sql.PING)
        except CLIENT_ERRORS as exc:
            logger.info("PostgreSQL liveness probe failed: %r", exc)
            return False
        return True

    # -- background and closing -------------------------------------------------

    def spawn_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference and retrieving its outcome."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve_outcome)

    async def aclose(self) -> None:
        """Stop the timers, give parked connections back, and close the pool if it is asynclock's."""
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
        for timer in (self._sweep, self._watch, self._probe_timer):
            if timer is not None:
                timer.cancel()
        self._sweep = self._watch = self._probe_timer = None
        self._watch_at = math.inf
        while (conn := self.take_parked()) is not None:
            self.spawn_background(self._return(conn, 1.0))
        if self._background:  # connections on their way back to the pool
            await asyncio.wait(list(self._background), timeout=ADMIN_TIMEOUT)
        if self.owns_pool and self.pool is not None:
            pool, self.pool = self.pool, None
            if pool.get_size() > pool.get_idle_size():
                # Waits still queued on the server: ending their sessions ends them.
                pool.terminate()
                return
            try:
                await asyncio.wait_for(pool.close(), timeout=ADMIN_TIMEOUT)
            except Exception:  # noqa: BLE001 - a silent server: drop the sockets
                pool.terminate()


async def _no_reset(conn: Any) -> None:
    """Pool reset hook for asynclock's own pool: lease connections clean up after themselves."""


def _with_check_interval(init: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """The ``init`` of asynclock's own pool: client_connection_check_interval, once per connection."""

    async def setup(conn: Any) -> None:
        if conn.get_server_version().major >= 14:
            await conn.execute(_sql.SET_CHECK_INTERVAL.format(ms=CHECK_INTERVAL_MS))
        if init is not None:
            await init(conn)

    return setup


async def _acquire_from(pool: Any) -> Any:
    """``pool.acquire()`` as a coroutine (it returns an awaitable context object)."""
    return await pool.acquire()
