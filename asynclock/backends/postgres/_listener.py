"""The client's listening session: how its waiters hear that they may try, and how it answers questions.

One connection per client, holding no lock of a hold:

* It LISTENs on the backend's channel. A release that finds waiters queued
  NOTIFYs the first one's channel (``t <hold>``: try now; ``h <hold>``: you
  are first in line now); another client asks who holds a key
  (``i <its backend> <request> <k1> <k2>``) and gets the answer on its own
  channel (``r <request> <json>``); see ``_inspect``.
* It holds, shared, the *marker* of every key this client has waiters queued
  for (and a semaphore's permits key while the client holds a permit): a
  newcomer that finds a marker taken does not jump the queue, and a release
  that finds one wakes the first waiter. Markers are counted here and taken
  or let go of in batches, in tasks of their own, so a caller that gives up
  never leaves one in an unknown state.
* It holds its *session key* for its life: the queue rows of this client's
  waiters are live while it does. When the listening session ends, its
  rows are dead (others pass over them, and the next grant deletes them),
  its markers are gone, and it is opened again with a new key
  (``incarnation``); the client's waiters queue again.
* It LISTENs on the channels of the elections its client observes
  (``_election``), from the first observer's read on; once opened again,
  each observer LISTENs again on its next read.
* With waiters queued it runs with ``idle_session_timeout`` (the shortest
  ttl of its waiters) and pings itself, so the rows of a client that hangs
  die with its session instead of blocking the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from ..._errors import LockError, plain
from ..._timing import request_window
from .._background import until_done
from ._errors import CLIENT_ERRORS, Translation
from ._keys import Key, app_name, channel, session_key
from ._pool import ADMIN_TIMEOUT, Pool, is_closed, ms, terminate, unwrap
from ._sql import MARK, PING, SET_IDLE, SET_UP_LISTENER, UNMARK

__all__ = ["Listener"]

logger = logging.getLogger("asynclock")

T = TypeVar("T")

#: lock_timeout of the listening session: a marker is taken shared and waits only for a
#: statement that tests it this very instant.
MARK_TIMEOUT = 5.0


class Listener:
    """The listening session of one backend.

    ``on_message(payload)``: a notification arrived on the backend's channel;
    ``on_lost()``: the session ended (its waiters' rows died with it).
    """

    def __init__(
        self,
        pool: Pool,
        errors: Translation,
        backend: str,
        *,
        on_message: Callable[[str], None],
        on_lost: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._errors = errors
        self.backend = backend
        self.channel = channel(backend)
        self.proxy: Any = None
        self.conn: Any = None
        #: Increases each time the session is opened again; its key changes with it.
        self.incarnation = 0
        self.key: Key = session_key(backend, 0)
        #: Told each notification's payload (public: a test counts them on their way).
        self.on_message = on_message
        self._on_lost = on_lost
        self._lock = asyncio.Lock()
        # other channels this session LISTENs on (elections'), with their callbacks
        self._channels: dict[str, Callable[[Any, int, str, str], None]] = {}
        self._want: dict[Key, int] = {}
        self._held: set[Key] = set()
        self._idle = 0.0
        self._keepalive: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._reopen: asyncio.Task[None] | None = None
        self._reopen_failed: str | None = None  # why the last try to open it again failed
        self._closed = False

    @property
    def alive(self) -> bool:
        return self.conn is not None and not is_closed(self.conn)

    # -- the session ----------------------------------------------------------------

    async def open(self) -> None:
        """Open the listening session (again): LISTEN, its session key, its lock_timeout."""
        if self._closed:
            raise self._errors.unavailable("the backend is closed")
        self.incarnation += 1
        key = session_key(self.backend, self.incarnation)
        loop = asyncio.get_running_loop()
        proxy = await self._pool.checkout(loop.time() + ADMIN_TIMEOUT)
        conn = unwrap(proxy)
        try:
            async with self._errors.edge, asyncio.timeout(ADMIN_TIMEOUT):
                # (not the client's id: no lock of a hold is on it)
                name = app_name("listening", self.backend)
                taken = await conn.fetchrow(SET_UP_LISTENER, name, *key, ms(MARK_TIMEOUT))
                if not taken[2]:
                    raise self._errors.unavailable("the listening session's key is held by another session")
                await conn.add_listener(self.channel, self._notified)
        except BaseException:
            terminate(conn)
            raise
        self.proxy, self.conn, self.key = proxy, conn, key
        self._held.clear()
        self._channels.clear()
        self._idle = 0.0
        self._last = loop.time()
        conn.add_termination_listener(self._ended)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_message(payload)

    def _ended(self, conn: Any) -> None:
        if conn is not self.proxy and conn is not self.conn:
            return
        self.conn = self.proxy = None
        self._held.clear()
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._closed:
            return
        self._on_lost()
        if self._reopen is None or self._reopen.done():
            self._reopen = self._pool.background.spawn(
                until_done(self._open_again, moot=lambda: self._closed or self.alive, retry=())
            )

    async def _open_again(self) -> bool:
        """One try at opening the session again (in the background, backing off while the server is away)."""
        try:
            await self.statement(lambda conn: conn.fetchval(PING))
        except Exception as exc:  # noqa: BLE001 - the server's, or ours translated: try again later
            why = plain(exc)
            level = logging.DEBUG if why == self._reopen_failed else logging.INFO  # (the same again is not news)
            logger.log(level, "PostgreSQL listening session not open again yet: %s", why)
            self._reopen_failed = why
            return False
        self._reopen_failed = None
        return True

    async def statement(
        self, run: Callable[[Any], Awaitable[T]], within: float = ADMIN_TIMEOUT, *, changes: bool = False
    ) -> T:
        """Run ``run(conn)`` on the listening session (opened again if it ended, with its markers), one at a time.

        ``changes``: it changes queue rows or markers. If it fails, its outcome is
        unknown (a row left in, a marker taken): the session is closed, which
        kills this client's rows and markers at once, and its waiters queue again.
        """
        async with self._lock:
            if not self.alive:
                await self.open()
                try:
                    async with self._errors.edge, asyncio.timeout(within):
                        await self.mark_on(self.conn)
                except BaseException:
                    terminate(self.conn)
                    raise
            conn = self.conn
            try:
                async with self._errors.edge, asyncio.timeout(within):
                    return await run(conn)
            except BaseException:
                if changes:
                    logger.info("closing the PostgreSQL listening session: a change to its queue rows was cut short")
                    terminate(conn)
                raise
            finally:
                self._last = asyncio.get_running_loop().time()

    async def job(self, run: Callable[[Any], Awaitable[T]], within: float = ADMIN_TIMEOUT) -> T:
        """A ``statement`` that changes queue rows or markers, in a task of its own: a caller
        that gives up does not cut it in half."""
        task = self._pool.background.spawn(self.statement(run, within, changes=True))
        return await asyncio.shield(task)

    async def listen(self, conn: Any, channel: str, callback: Callable[[Any, int, str, str], None]) -> None:
        """LISTEN on ``channel`` too (in a ``statement`` on ``conn``, the session now), once per session."""
        if channel not in self._channels:
            await conn.add_listener(channel, callback)
            self._channels[channel] = callback

    # -- markers ------------------------------------------------------------------------

    def want(self, key: Key) -> None:
        """Count one more reason to hold ``key`` shared (``ensure`` takes it)."""
        self._want[key] = self._want.get(key, 0) + 1

    async def ensure(self, key: Key) -> None:
        """Return once ``key`` is held (if it is still wanted)."""
        if key not in self._held and key in self._want:
            await self.job(lambda conn: self.mark_on(conn))

    def drop(self, key: Key) -> None:
        """Count one reason less; at none, ``key`` is let go of (in the background)."""
        count = self._want.get(key, 0) - 1
        if count > 0:
            self._want[key] = count
            return
        self._want.pop(key, None)
        if key in self._held:
            self._pool.background.spawn(self._mark())

    async def let_go(self, key: Key, within: float) -> None:
        """``drop``, and at none return once ``key`` is let go of (at most ``within`` seconds)."""
        count = self._want.get(key, 0) - 1
        if count > 0:
            self._want[key] = count
            return
        self._want.pop(key, None)
        if key in self._held:
            with contextlib.suppress(LockError, *CLIENT_ERRORS):
                await self.job(lambda conn: self.mark_on(conn), within=within)

    def held(self, key: Key) -> bool:
        return key in self._held

    async def _mark(self) -> None:
        with contextlib.suppress(LockError, *CLIENT_ERRORS):
            await self.statement(lambda conn: self.mark_on(conn), changes=True)

    async def mark_on(self, conn: Any) -> None:
        """Take the wanted keys not held yet, let go of the held ones not wanted, in one statement each."""
        take = [key for key in self._want if key not in self._held]
        if take:
            await conn.fetchval(MARK, [k[0] for k in take], [k[1] for k in take])
            self._held.update(take)
        drop = [key for key in self._held if key not in self._want]
        if drop:
            await conn.fetchval(UNMARK, [k[0] for k in drop], [k[1] for k in drop])
            self._held.difference_update(drop)

    # -- liveness of its rows --------------------------------------------------------------

    async def keep_alive_for(self, ttl: float, conn: Any, pg14: bool) -> None:
        """With waiters of lease ``ttl`` queued: end the session a ttl after its last statement if the
        client hangs (``pg14``: the server has idle_session_timeout)."""
        if not pg14 or (self._idle and self._idle <= ttl):
            return
        await conn.execute(SET_IDLE, ms(ttl))
        self._idle = ttl
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._keepalive = asyncio.get_running_loop().call_later(ttl / 3, self._ping_due)

    def _ping_due(self) -> None:
        self._keepalive = None
        if self._closed or not self.alive:
            return
        period = self._idle / 3
        loop = asyncio.get_running_loop()
        if loop.time() - self._last >= period and not self._lock.locked():
            self._pool.background.spawn(self._ping(period))
        self._keepalive = loop.call_later(period, self._ping_due)

    async def _ping(self, period: float) -> None:
        with contextlib.suppress(LockError, *CLIENT_ERRORS):
            await self.statement(lambda conn: conn.fetchval(PING), within=max(request_window(self._idle), period))

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._reopen is not None and not self._reopen.done():
            self._reopen.cancel()
        try:
            async with asyncio.timeout(ADMIN_TIMEOUT):
                await self._lock.acquire()  # a statement in flight (a marker let go of, an answer) ends first
        except TimeoutError:
            if self.conn is not None:
                terminate(self.conn)
            return
        try:
            proxy, conn = self.proxy, self.conn
            self.proxy = self.conn = None
            if proxy is None:
                return
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_termination_listener(self._ended)
            with contextlib.suppress(*CLIENT_ERRORS):
                async with asyncio.timeout(ADMIN_TIMEOUT):
                    await conn.remove_listener(self.channel, self._notified)
                    for name, callback in list(self._channels.items()):
                        await conn.remove_listener(name, callback)
            self._channels.clear()
            await self._pool.give_back(proxy, self._idle > 0)
        finally:
            self._lock.release()
