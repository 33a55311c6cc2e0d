"""Where a backend's connections come from: the pool (its own or a given one), and its background work.

The listening session and the sessions of holds both take their connections
here, before and after the set-up alike, and give them back clean: nothing
of asynclock's (advisory locks, LISTENs, settings) left on a connection that
goes back to the pool, else it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from typing import Any

import asyncpg

from ..._errors import BackendUnavailable, plain
from .._background import Background
from ._config import PROXY_CONNECTION
from ._errors import Translation
from ._sql import GIVE_BACK, GIVE_BACK_PG13

__all__ = ["ADMIN_TIMEOUT", "Pool", "is_closed", "ms", "terminate", "unwrap"]

logger = logging.getLogger("asynclock")

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


def unwrap(proxy: Any) -> Any:
    """The connection under a pool's proxy (requests on it skip the proxy), else ``proxy`` itself."""
    return getattr(proxy, PROXY_CONNECTION, None) or proxy


class Pool:
    """The pool of one backend's connections, and the registry of its background tasks."""

    def __init__(
        self, pool: Any, *, dsn: str | None, pool_options: dict[str, Any], max_leases: int, errors: Translation
    ) -> None:
        self.pool: Any = pool
        self.owns_pool = pool is None
        self._dsn = dsn
        self._pool_options = pool_options
        #: How many sessions may hold locks at once (the listening session comes on top).
        self.max_leases = max_leases
        self._errors = errors
        #: Clean-ups and other work that outlives the request that started it.
        self.background = Background()
        #: A session was closed for not answering, and none has been opened since.
        self.silenced = False
        # Connections given back clean and not taken again: a checkout needs no connect.
        self._returned_clean = 0

    async def open(self) -> None:
        """Create asynclock's own pool: ``max_leases`` sessions plus the listening one."""
        options = dict(self._pool_options)
        if "reset" in inspect.signature(asyncpg.create_pool).parameters:
            # Connections come back with GIVE_BACK run already: no RESET ALL round trip.
            options.setdefault("reset", _no_reset)
        async with self._errors.edge, asyncio.timeout(ADMIN_TIMEOUT):
            self.pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=self.max_leases + 1, **options)

    async def checkout(self, bound: float) -> Any:
        """A connection of the pool by the loop time ``bound``.

        With a connection this backend gave back to the pool it is a plain
        ``acquire`` (no I/O as a rule). Otherwise the checkout, which may
        connect, runs in its own task: a caller that gives up leaves it to
        finish, and a connection it brings back goes straight back to the
        pool, so no half-made connection is left behind. BackendUnavailable
        when the backend is closed or no connection came in time.
        """
        pool, errors = self.pool, self._errors
        if pool is None:
            raise errors.unavailable("the backend is closed")
        if self._returned_clean > 0:
            self._returned_clean -= 1
            with errors.edge:
                return await pool.acquire()
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = loop.create_task(_acquire_from(pool))
        try:
            try:
                async with errors.edge, asyncio.timeout_at(bound):
                    return await asyncio.shield(task)
            except BackendUnavailable as exc:
                if not isinstance(exc.__cause__, TimeoutError):
                    raise
                took = f"{loop.time() - started:.1f} s"
                if self.silenced:
                    # A session was closed for not answering: it is the server that went silent.
                    error = errors.unavailable(f"stopped answering (no connection within {took})")
                    error.retryable = False
                    raise error from exc.__cause__
                raise errors.unavailable(f"timed out after {took} getting a connection") from exc.__cause__
        except BaseException:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    self.background.spawn(pool.release(task.result()))
            else:
                task.add_done_callback(self._return_late_checkout)
            raise

    def _return_late_checkout(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None and self.pool is not None:
            self.background.spawn(self.pool.release(task.result()))

    async def give_back(self, proxy: Any, idle_set: bool) -> None:
        """Return a connection to the pool with nothing of asynclock's on it, else close it.

        ``idle_set``: its idle_session_timeout was set (PostgreSQL 14+), and is reset too.
        """
        conn = unwrap(proxy)
        try:
            async with asyncio.timeout(ADMIN_TIMEOUT):
                if not is_closed(conn):
                    await conn.execute(GIVE_BACK if idle_set else GIVE_BACK_PG13)
                await self.pool.release(proxy)
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL connection the pool did not take back clean: %s", plain(exc))
            terminate(conn)
            return
        self._returned_clean += 1

    async def aclose(self) -> None:
        """Let the background work end (within ``ADMIN_TIMEOUT``), then close the pool if it is asynclock's.

        The caller has given back (or closed) every connection it took.
        """
        await self.background.aclose(ADMIN_TIMEOUT)
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
