"""PostgreSQL (``postgresql://``, ``postgres://``, or a given ``asyncpg.Pool``).

A hold is a *session-level advisory lock* on a connection kept for the whole
lease, one connection per hold:

* Waiting is the server's own lock queue (``pg_advisory_lock`` bounded by
  ``lock_timeout``), so nobody polls; ``timeout=0`` is one
  ``pg_try_advisory_lock``. A waiter the caller cancels is cancelled on the
  server too (asyncpg sends a CancelRequest and waits for it to be
  acknowledged); whatever the cancelled statement got is unlocked before the
  connection goes back to the pool, and a connection that cannot be brought
  back to a known state in time is closed (its session, and so its locks, end
  with it). Waiting sessions run with ``client_connection_check_interval``
  (PostgreSQL 14+), so the waiter of a client that crashed or closed its
  connection leaves the queue instead of waiting on as a ghost. A wait with
  no timeout probes the server every ttl on another connection, so a server
  that went silent ends it with ``BackendUnavailable``.
* The lease is the connection. Each lease connection runs with
  ``idle_session_timeout`` = ttl (PostgreSQL 14+), so a holder that hangs or is
  cut off loses its session, and its locks, a ttl after its last ping; the
  watchdog pings every ttl/3, and the client's trusted deadline (ping send
  time + ttl - drift) ends before the server could end the session. A
  connection that closes (``pg_terminate_backend``, server restart, network)
  loses its holds at once, through asyncpg's termination listener.
* The fencing token is a per-name counter, UPSERT'ed in the same statement
  that takes the lock, in the table ``<prefix>_fence`` (``table=`` to choose
  another, ``schema.table`` allowed), created when missing.
* Names map to keys in the two-int advisory space (``pg_advisory_lock(int4,
  int4)``, ``objsubid = 2`` in ``pg_locks``): 64 bits of BLAKE2b over
  prefix and name. The two-int space keeps clear of the single-bigint keys
  other tools use (migrations, job queues). Two names whose keys collide share
  one lock: that can only add exclusion (a hold of either name keeps the other
  out), never remove it, because a session lock is exclusive per key and each
  hold has its own session. ``info`` tells colliding names apart through a
  second, independent digest of the name carried in the holder's
  ``application_name``.
* Re-entry is counted in the client; the server holds the lock once per hold.

Connections: with a URL asynclock opens its own pool, ``max_leases`` (default
50) connections for holds and waiters plus one for ``info`` and probes, so
held locks never take connections from the application. With a given pool,
holds and waiters borrow from it, at most ``max_leases`` at a time (default:
half of the pool's ``max_size``) so the application keeps the rest; the pool
is not closed by asynclock. Either way every held *or waiting* lock costs one
server connection (a backend process) for as long as it is held or waited
for; several locks are never multiplexed on one connection, because a
blocking wait occupies its session and the death of a shared session would
take every lock on it. Session locks need a real session: do not put a
transaction-pooling PgBouncer between asynclock and PostgreSQL.

What it does not survive: advisory locks live in the primary's memory and are
not replicated. After a failover the new primary knows no locks, while a
holder still connected to an old primary that keeps running believes it holds
its lock; and with asynchronous replication the promoted server may miss the
last counter increments, so a token can repeat. Use it on one primary (or
accept that a failover is a window where only your own fencing checks help).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import math
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'asynclock[postgres]'") from exc

from .._errors import BackendUnavailable, LockError
from .._values import LockInfo
from ..abc import LOCK, Acquired, Backend, BackendHooks, Busy, RenewItem, Shape, unsupported

__all__ = ["PostgresBackend", "advisory_key", "name_check"]

logger = logging.getLogger("asynclock")

#: Connections for holds and waiters when asynclock opens the pool itself.
DEFAULT_MAX_LEASES = 50
#: Bound on short requests (info, probes, setup, cleanup), in seconds.
ADMIN_TIMEOUT = 10.0
#: Longest wait for a lease connection's clean-up before it is closed instead, in seconds.
CLEANUP_TIMEOUT = 1.0
#: Tag at the start of a lease connection's application_name.
APP_TAG = "asynclock"
#: PostgreSQL truncates application_name to this many bytes.
APP_NAME_MAX = 63
#: A statement timeout for asyncpg that never fires first (our own bounds apply).
_NO_COMMAND_TIMEOUT = 1e9

Key = tuple[int, int]

#: Everything asyncpg (and the socket under it) raises; translated at the edge.
_CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def advisory_key(prefix: str, name: str) -> Key:
    """The two-int advisory lock key of ``name`` under ``prefix`` (stable across versions)."""
    digest = hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=8, person=b"asynclock-key").digest()
    high, low = struct.unpack(">ii", digest)
    return high, low


def name_check(prefix: str, name: str) -> str:
    """8 hex digits from a digest independent of the key: tells colliding names apart."""
    return hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=4, person=b"asynclock-chk").hexdigest()


def _quote_ident(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


def _table_sql(table: str) -> str:
    return ".".join(_quote_ident(part) for part in table.split(".", 1))


def _ms(seconds: float) -> str:
    """Seconds as a GUC value in ms, rounded up and never 0 (0 would mean 'no limit')."""
    return str(max(1, math.ceil(seconds * 1000)))


def _translate(exc: BaseException) -> BaseException:
    """Map asyncpg (and socket) errors onto ours; the caller keeps the original as ``__cause__``."""
    if isinstance(exc, LockError):
        return exc
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return ValueError(f"bad PostgreSQL connection settings: {exc}")
    if isinstance(
        exc,
        (
            asyncpg.PostgresConnectionError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
            asyncpg.CannotConnectNowError,
            asyncpg.TooManyConnectionsError,
            asyncpg.AdminShutdownError,
            asyncpg.CrashShutdownError,
            OSError,
            TimeoutError,
        ),
    ):
        return BackendUnavailable(f"PostgreSQL did not answer: {exc!r}")
    if isinstance(exc, asyncpg.PostgresError):
        return LockError(f"PostgreSQL error: {exc!r}")
    return exc


@contextlib.asynccontextmanager
async def _edge() -> AsyncIterator[None]:
    """Translate client errors at the backend's edge (nothing of asyncpg leaks out)."""
    try:
        yield
    except _CLIENT_ERRORS as exc:
        translated = _translate(exc)
        if translated is exc:
            raise
        raise translated from exc


def _is_closed(conn: Any) -> bool:
    """Whether a pool connection is closed (a proxy the pool took back after a close counts as closed)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def _terminate(conn: Any) -> None:
    """Close a pool connection's socket now; its session, and every lock of it, ends with it."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


def _quiet(task: asyncio.Task[Any]) -> None:
    """Done callback: fetch a background task's exception so it is never reported as unretrieved."""
    if not task.cancelled():
        task.exception()


@dataclass(eq=False)
class _Hold:
    """One held advisory lock and the connection (session) that holds it."""

    name: str
    key: Key
    conn: Any  # an asyncpg pool connection
    ttl: float
    count: int = 1
    lost: bool = False
    released: bool = False
    ping: asyncio.Task[Any] | None = None
    on_close: Callable[[Any], None] | None = field(default=None, repr=False)


class PostgresBackend:
    """Locks on one PostgreSQL server (advisory locks on leased connections)."""

    kind = "postgres"
    queues_waiters = True

    def __init__(
        self,
        pool: Any = None,
        *,
        dsn: str | None = None,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | None = None,
        pool_options: dict[str, Any] | None = None,
    ) -> None:
        if (pool is None) == (dsn is None):
            raise TypeError("PostgresBackend needs exactly one of an asyncpg pool or a dsn")
        if max_leases is not None and (isinstance(max_leases, bool) or not isinstance(max_leases, int)):
            raise TypeError(f"max_leases must be int, not {type(max_leases).__name__}")
        if max_leases is not None and max_leases < 1:
            raise ValueError(f"max_leases must be at least 1, got {max_leases}")
        if table is not None and (not isinstance(table, str) or not table):
            raise ValueError(f"table must be a non-empty str, got {table!r}")
        self._pool: Any = pool
        self._owns_pool = pool is None
        self._dsn = dsn
        self._pool_options = dict(pool_options or {})
        self._prefix = prefix
        self._table = table if table is not None else f"{prefix}_fence"
        if max_leases is None:
            max_leases = DEFAULT_MAX_LEASES if pool is None else max(1, pool.get_max_size() // 2)
        self._max_leases = max_leases
        self._key_of: Callable[[str], Key] = lambda name: advisory_key(prefix, name)
        self._holds: dict[str, _Hold] = {}
        self._hooks: BackendHooks | None = None
        self._slots: asyncio.Semaphore | None = None
        self._probe: asyncio.Task[bool] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._starting: asyncio.Task[None] | None = None
        self._pg14 = True  # PostgreSQL 14+: idle_session_timeout, client_connection_check_interval
        self._sql_try = ""
        self._sql_wait = ""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | str | None = None,
        **options: Any,
    ) -> PostgresBackend:
        """A backend with its own pool for ``url`` (closed by ``aclose``).

        ``options`` go to ``asyncpg.create_pool`` (e.g. ``password=``, ``ssl=``).
        """
        # asyncpg would send unknown query parameters to the server as settings:
        # take ours out first.
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        max_leases = query.pop("max_leases", max_leases)
        table = query.pop("table", table)
        url = urlunsplit(parts._replace(query=urlencode(query)))
        if isinstance(max_leases, str):
            try:
                max_leases = int(max_leases)
            except ValueError as exc:
                raise ValueError(f"bad max_leases: {max_leases!r}") from exc
        for own in ("min_size", "max_size"):
            if own in options:
                raise ValueError(f"{own} is chosen by asynclock; use max_leases= to size the pool")
        return cls(dsn=url, prefix=prefix, table=table, max_leases=max_leases, pool_options=options)

    @property
    def pool(self) -> Any:
        """The asyncpg pool in use (None before ``start`` when asynclock opens it)."""
        return self._pool

    @property
    def max_leases(self) -> int:
        return self._max_leases

    # -- keys -------------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        high, low = self._key_of(name)
        return f"pg_advisory({high},{low})"

    def primitive(self, shape: Shape) -> Backend:
        """Only the plain lock; other shapes raise NotImplementedError."""
        if shape == LOCK:
            return self
        raise unsupported(self.kind, shape)

    def _app_name(self, name: str, hold: str) -> str:
        return f"{APP_TAG} {name_check(self._prefix, name)} {hold}"[:APP_NAME_MAX]

    # -- protocol ---------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        # The server ends a lease connection idle for ttl (idle_session_timeout),
        # counted from the end of its last statement, which is after that
        # statement was sent.
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_leases)
        # The set-up runs in its own task: a caller cancelled meanwhile (the
        # first acquire starts the client) does not cut a connection attempt
        # in half; the next call waits for the same set-up.
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._start())
            task.add_done_callback(_quiet)
        await asyncio.shield(task)

    async def _start(self) -> None:
        if self._pool is None:
            options = dict(self._pool_options)
            if "reset" in inspect.signature(asyncpg.create_pool).parameters:
                # Lease connections undo their own settings and lock when they
                # are given back; the pool's RESET ALL round trip is not needed.
                options.setdefault("reset", _no_reset)
            async with _edge(), asyncio.timeout(ADMIN_TIMEOUT):
                self._pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=self._max_leases + 1, **options)
        async with _edge(), self._borrow(ADMIN_TIMEOUT) as conn:
            version = int(await conn.fetchval("SELECT current_setting('server_version_num')"))
            self._pg14 = version >= 140000
            await self._create_table(conn)
        self._prepare_sql()

    async def _create_table(self, conn: Any) -> None:
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {_table_sql(self._table)} ("
            "name bytea PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL, value bigint NOT NULL)"
        )
        # Two clients creating it at the same moment collide in the catalog
        # (the loser's error comes once the winner committed): try again, and
        # IF NOT EXISTS then sees the winner's table.
        for attempt in range(3):
            try:
                await conn.execute(ddl)
                return
            except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError):
                if attempt == 2:
                    raise

    def _prepare_sql(self) -> None:
        table = _table_sql(self._table)
        # PostgreSQL 14+: a hung holder's session ends a ttl after its last statement.
        idle = "set_config('idle_session_timeout', $5, false)" if self._pg14 else "$5::text"
        # $1, $2 key; $3 name (UTF-8 bytes: a name may hold NUL, which text cannot);
        # $4 application_name; $5 idle_session_timeout (ms);
        # $6 lock_timeout (ms, '0' = no limit; local to this statement's transaction).
        # Returns (ok, token). The lock is taken first; the session settings
        # and the token only when it was granted, all in one round trip.
        template = f"""
            WITH got AS MATERIALIZED (
                SELECT set_config('lock_timeout', $6, true) AS lt, {{lock}} AS ok
            ), cfg AS MATERIALIZED (
                SELECT set_config('application_name', $4, false) AS app, {idle} AS idle FROM got WHERE ok
            ), fence AS (
                INSERT INTO {table} AS f (name, k1, k2, value)
                SELECT $3::bytea, $1, $2, 1 FROM got WHERE ok
                ON CONFLICT (name) DO UPDATE SET value = f.value + 1, k1 = EXCLUDED.k1, k2 = EXCLUDED.k2
                RETURNING f.value
            )
            SELECT (SELECT ok FROM got) AS ok, (SELECT value FROM fence) AS token, (SELECT count(*) FROM cfg) AS cfg
        """
        self._sql_try = template.replace("{lock}", "pg_try_advisory_lock($1::int4, $2::int4)")
        self._sql_wait = template.replace("{lock}", "pg_advisory_lock($1::int4, $2::int4) IS NOT NULL")

    def _cleanup_sql(self, key: Key) -> str:
        """Undo a lease connection's lock and settings (simple protocol: one round trip)."""
        idle = " RESET idle_session_timeout; RESET client_connection_check_interval;" if self._pg14 else ""
        return f"SELECT pg_advisory_unlock({int(key[0])}, {int(key[1])}); RESET application_name;{idle}"

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        got = await self.wait_acquire(name, hold, ttl, 0.0)
        return Busy(None) if got is None else got

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        if self._slots is None or self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # A place among this client's lease connections: waiting for one is
        # waiting for the lock (FIFO), within the caller's time.
        try:
            async with asyncio.timeout_at(deadline if deadline is None else max(deadline, loop.time() + 0.001)):
                await self._slots.acquire()
        except TimeoutError:
            return None
        conn: Any = None
        result: Acquired | None = None
        try:
            # Connecting takes what it takes, but never longer than the lease
            # time or the caller's time, whichever is longer.
            connect_by = loop.time() + ttl if deadline is None else max(deadline, loop.time() + ttl)
            conn = await self._checkout(connect_by)
            result = await self._lock(conn, name, hold, ttl, deadline)
        except BaseException:
            try:
                if conn is not None:
                    # Whatever the statement got, give it back before the error goes on.
                    await self._give_back(conn, self._key_of(name), ttl)
            finally:
                self._slots.release()
            raise
        if result is None:
            # A wait can end in lock_timeout after the grant (on the fence
            # row's lock, should something else hold it): the session lock
            # outlives the statement's error, so unlock it. One try
            # (timeout=0) that said no got nothing and set nothing.
            try:
                await self._give_back(conn, None if timeout == 0 else self._key_of(name), ttl)
            finally:
                self._slots.release()
        return result

    async def _checkout(self, bound: float) -> Any:
        """A connection from the pool by ``bound``.

        The checkout runs in its own task: a caller that gives up (cancelled,
        out of time) leaves it to finish, and a connection it brings back goes
        straight back to the pool, so no half-made connection is left behind.
        """
        task = asyncio.get_running_loop().create_task(_acquire_from(self._pool))
        try:
            async with _edge(), asyncio.timeout_at(bound):
                return await asyncio.shield(task)
        except BaseException:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    self._later(self._pool.release(task.result()))
            else:
                task.add_done_callback(self._return_late_checkout)
            raise

    @contextlib.asynccontextmanager
    async def _borrow(self, within: float) -> AsyncIterator[Any]:
        """A pool connection for one short request, all of it bounded by ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        conn = await self._checkout(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                yield conn
        finally:
            # Back to the pool even if the caller is cancelled meanwhile; the
            # pool waits for a cancelled statement to be acknowledged (or
            # closes the connection).
            self._later(self._pool.release(conn, timeout=max(0.05, min(within, ADMIN_TIMEOUT))))

    def _return_late_checkout(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._later(self._pool.release(task.result()))

    def _later(self, coro: Any) -> None:
        """Run ``coro`` in the background, keeping a reference and swallowing its outcome."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_quiet)

    async def _lock(self, conn: Any, name: str, hold: str, ttl: float, deadline: float | None) -> Acquired | None:
        """Take the lock on ``conn``: Acquired, or None when the time ran out; any error propagates."""
        loop = asyncio.get_running_loop()
        key = self._key_of(name)
        sent = loop.time()
        remaining = None if deadline is None else deadline - sent
        args = (key[0], key[1], name.encode(), self._app_name(name, hold), _ms(ttl))
        if remaining is not None and remaining <= 0:
            async with _edge(), asyncio.timeout_at(sent + ttl):
                row = await conn.fetchrow(self._sql_try, *args, "0")
        else:
            if self._pg14:
                # A waiting session does not read its socket: without this
                # check a waiter whose client is gone (crashed, or closed the
                # connection) stays queued as a ghost until its turn comes.
                # The server arms the check when a statement starts, so it is
                # set beforehand (one more round trip, on the waiting path only).
                async with _edge(), asyncio.timeout_at(sent + ttl):
                    await conn.execute(f"SET client_connection_check_interval = {_ms(min(ttl / 3, 1.0))}")
            lock_timeout = "0" if remaining is None else _ms(remaining)
            row = await self._wait(conn, ttl, deadline, self._sql_wait, *args, lock_timeout)
        if row is None or not row["ok"]:
            return None
        token = int(row["token"])
        confirmed = sent
        if loop.time() - sent > ttl / 3:
            # A long wait: the grant's own send time is too old to count the
            # lease from. One ping on the lease connection, sent now, proves it.
            confirmed = loop.time()
            async with _edge(), asyncio.timeout_at(confirmed + ttl):
                await conn.fetchval("SELECT 1")
        hold_record = _Hold(name=name, key=key, conn=conn, ttl=ttl)
        hold_record.on_close = self._on_close_callback(hold, hold_record)
        with contextlib.suppress(asyncpg.InterfaceError):  # a proxy the pool took back: closed
            conn.add_termination_listener(hold_record.on_close)
        if _is_closed(conn):
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_termination_listener(hold_record.on_close)
            raise BackendUnavailable("the PostgreSQL connection closed right after the lock was granted")
        self._holds[hold] = hold_record
        return Acquired(token, confirmed_at=confirmed)

    async def _wait(self, conn: Any, ttl: float, deadline: float | None, sql: str, *args: Any) -> Any:
        """Run the blocking statement: its row, or None when ``lock_timeout`` ended the wait.

        Bounded by the deadline (plus a grace) and by server liveness.

        While it waits, the server is probed every ttl on another connection,
        so a server that went silent (paused, cut off) is not waited for
        forever; a silent server raises BackendUnavailable.
        """
        loop = asyncio.get_running_loop()
        grace = max(0.1, min(ttl / 3, 2.0))
        # Our own bounds apply, not the pool's command_timeout.
        task = loop.create_task(conn.fetchrow(sql, *args, timeout=_NO_COMMAND_TIMEOUT))
        task.add_done_callback(_quiet)
        try:
            while True:
                now = loop.time()
                step = ttl if deadline is None else min(ttl, deadline + grace - now)
                done, _ = await asyncio.wait({task}, timeout=max(step, 0.0))
                if done:
                    if isinstance(task.exception(), asyncpg.LockNotAvailableError):
                        return None  # lock_timeout: the server gave up waiting
                    async with _edge():
                        return task.result()
                if deadline is not None and loop.time() >= deadline + grace:
                    raise BackendUnavailable("PostgreSQL did not answer within the acquire timeout")
                if not await self._server_alive(ttl):
                    raise BackendUnavailable("PostgreSQL stopped answering while the lock was awaited")
        finally:
            if not task.done():
                # asyncpg sends a CancelRequest; the next statement on this
                # connection waits until the server acknowledged it.
                task.cancel()

    async def _server_alive(self, within: float) -> bool:
        """One shared probe at a time: can a connection of the pool run ``SELECT 1`` within ``within``?"""
        task = self._probe
        if task is None or task.done():
            task = self._probe = asyncio.get_running_loop().create_task(self._probe_once(within))
        return await asyncio.shield(task)

    async def _probe_once(self, within: float) -> bool:
        try:
            async with self._borrow(within) as conn:
                await conn.fetchval("SELECT 1")
        except _CLIENT_ERRORS as exc:
            logger.info("PostgreSQL liveness probe failed: %r", exc)
            return False
        return True

    def _on_close_callback(self, hold: str, record: _Hold) -> Callable[[Any], None]:
        def on_close(_conn: Any) -> None:
            if record.released or record.lost or self._holds.get(hold) is not record:
                return
            record.lost = True
            if self._hooks is not None:
                self._hooks.lose(
                    [hold], "the PostgreSQL connection holding the lock closed (terminated, restarted or cut off)"
                )

        return on_close

    async def _give_back(self, conn: Any, key: Key | None, ttl: float) -> bool:
        """Return ``conn`` to the pool in a known state (``key`` unlocked), else close it.

        Returns True if the connection went back clean, False if it was closed.
        Never raises and always finishes, even if the caller is cancelled meanwhile.
        """
        task = asyncio.get_running_loop().create_task(self._clean(conn, key, ttl))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            _terminate(conn)
            raise

    async def _clean(self, conn: Any, key: Key | None, ttl: float) -> bool:
        # A healthy server answers at once; one that does not is not waited
        # for: closing the connection ends the session, and its locks, too.
        bound = max(0.05, min(ttl / 3, CLEANUP_TIMEOUT))
        if _is_closed(conn):
            _terminate(conn)  # lets the pool take its holder back
            return False
        try:
            async with asyncio.timeout(bound):
                if key is not None:
                    await conn.execute(self._cleanup_sql(key))
                # (key None: nothing was granted, so nothing was set either.)
                await self._pool.release(conn, timeout=bound)
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection in an unknown state: %r", exc)
            _terminate(conn)
            return False
        return True

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        record = self._holds.get(hold)
        if record is None or record.lost or _is_closed(record.conn):
            return False
        record.count = count
        return True

    async def release(self, name: str, hold: str) -> bool:
        record = self._holds.pop(hold, None)
        if record is None:
            return False
        record.released = True
        assert self._slots is not None
        conn = record.conn
        if record.on_close is not None:
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_termination_listener(record.on_close)
        alive = not record.lost and not _is_closed(conn)
        try:
            ping = record.ping
            if alive and ping is not None and not ping.done():
                # A ping still runs on the connection: give it a moment, else close.
                await asyncio.wait({ping}, timeout=record.ttl / 3)
                if not ping.done():
                    _terminate(conn)
            # Whether it goes back clean or is closed (ending the session), the
            # server no longer holds the lock for this hold.
            await self._give_back(conn, record.key, record.ttl)
        except BaseException:
            _terminate(conn)
            raise
        finally:
            self._slots.release()
        return alive

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return list(await asyncio.gather(*(self._ping(item.hold) for item in items)))

    async def _ping(self, hold: str) -> bool | BaseException:
        """Prove the lease connection alive with a round trip sent now."""
        record = self._holds.get(hold)
        if record is None or record.lost or _is_closed(record.conn):
            return False
        loop = asyncio.get_running_loop()
        try:
            previous = record.ping
            if previous is not None and not previous.done():
                # An answer to an older ping would prove nothing about now:
                # let it finish, then send a new one.
                with contextlib.suppress(Exception):
                    await asyncio.shield(previous)
            if record.released or record.lost or _is_closed(record.conn):
                return False
            record.ping = loop.create_task(record.conn.fetchval("SELECT 1"))
            record.ping.add_done_callback(_quiet)
            await asyncio.shield(record.ping)
        except _CLIENT_ERRORS as exc:
            if record.lost or _is_closed(record.conn):
                return False
            translated = _translate(exc)
            translated.__cause__ = exc
            return translated
        return not record.lost

    async def subscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue wakes waiters itself."""

    async def unsubscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue wakes waiters itself."""

    async def info(self, name: str) -> LockInfo:
        if self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        high, low = self._key_of(name)
        # pg_locks shows the two-int key as unsigned oids, objsubid 2.
        sql = f"""
            WITH l AS (
                SELECT l.pid, l.granted FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.objsubid = 2
                  AND l.classid::int8 = $1 AND l.objid::int8 = $2
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            )
            SELECT
                (SELECT l.pid FROM l WHERE l.granted LIMIT 1) AS pid,
                (SELECT a.application_name FROM l JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.granted LIMIT 1) AS app,
                (SELECT count(*) FROM l WHERE NOT l.granted) AS waiters,
                (SELECT value FROM {_table_sql(self._table)} WHERE name = $3) AS token
        """
        async with _edge(), self._borrow(ADMIN_TIMEOUT) as conn:
            row = await conn.fetchrow(sql, high & 0xFFFFFFFF, low & 0xFFFFFFFF, name.encode())
        owner: str | None = None
        if row["pid"] is not None:
            parts = str(row["app"] or "").split(" ", 2)
            if len(parts) == 3 and parts[0] == APP_TAG:
                # Held for this name, or for another name whose key collides?
                owner = parts[2] if parts[1] == name_check(self._prefix, name) else None
            else:
                owner = f"pid {row['pid']} ({row['app'] or 'not asynclock'})"
        count = 0
        if owner is not None:
            mine = next((h for h in self._holds.values() if h.name == name and not h.lost), None)
            count = mine.count if mine is not None else 1
        return LockInfo(
            name=name,
            key=self.lock_key(name),
            owner=owner,
            hold_count=count,
            ttl=None,
            waiters=int(row["waiters"]),
            token=int(row["token"]) if owner is not None and row["token"] is not None else None,
        )

    async def names(self) -> list[str]:
        """Names under this client's table whose lock is held right now."""
        if self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        sql = f"""
            SELECT f.name FROM {_table_sql(self._table)} f
            WHERE EXISTS (
                SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
                  AND l.classid::int8 = (f.k1::int8 & 4294967295) AND l.objid::int8 = (f.k2::int8 & 4294967295)
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            )
            ORDER BY f.name
        """
        async with _edge(), self._borrow(ADMIN_TIMEOUT) as conn:
            rows = await conn.fetch(sql)
        return [bytes(row["name"]).decode() for row in rows]

    async def aclose(self) -> None:
        # Holds the front could not release: closing their sessions ends them.
        for hold, record in list(self._holds.items()):
            self._holds.pop(hold, None)
            record.released = True
            _terminate(record.conn)
        for task in (self._probe, self._starting):
            if task is not None and not task.done():
                task.cancel()
        if self._background:
            # connections on their way back to the pool
            await asyncio.wait(list(self._background), timeout=ADMIN_TIMEOUT)
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            if pool.get_size() > pool.get_idle_size():
                # Waiters still queued on the server: ending their sessions
                # ends their waits (they get BackendUnavailable).
                pool.terminate()
                return
            try:
                await asyncio.wait_for(pool.close(), timeout=ADMIN_TIMEOUT)
            except Exception:  # noqa: BLE001 - a silent server: drop the sockets
                pool.terminate()


async def _no_reset(conn: Any) -> None:
    """Pool reset hook for asynclock's own pool: lease connections clean up after themselves."""


async def _acquire_from(pool: Any) -> Any:
    """``pool.acquire()`` as a coroutine (it returns an awaitable context object)."""
    return await pool.acquire()
