"""PostgresBackend: the request protocol, on advisory locks held by lease connections."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from ..._errors import BackendUnavailable
from ..._options import DEFAULT_CONNECT_TIMEOUT, reject_unknown
from ..._timing import request_window
from ..._values import LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LockRef, Queued, RenewItem
from . import _sql
from ._config import dsn_address, dsn_secrets, parse_url, pool_address
from ._connections import LeaseConnections, is_closed, terminate
from ._errors import CLIENT_ERRORS, MapErrors
from ._hold import Hold
from ._inspect import read_holders
from ._keys import Key, advisory_key, fence_row, gate_key, name_check, rw_key, slot_arrays
from ._requests import Requests
from ._semaphore import Permits
from ._tokens import create_table, quote_table

__all__ = ["DEFAULT_MAX_LEASES", "PostgresBackend"]

#: Connections for holds and waiters when asynclock opens the pool itself.
DEFAULT_MAX_LEASES = 50

_CLOSED = "the PostgreSQL backend is closed"


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class PostgresBackend:
    """Locks on one PostgreSQL server (advisory locks on leased connections)."""

    kind = "postgres"

    def __init__(
        self,
        pool: Any = None,
        *,
        dsn: str | None = None,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | None = None,
        pool_options: dict[str, Any] | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if (pool is None) == (dsn is None):
            raise TypeError("PostgresBackend needs exactly one of an asyncpg pool or a dsn")
        if max_leases is not None and (isinstance(max_leases, bool) or not isinstance(max_leases, int)):
            raise TypeError(f"max_leases must be int, not {type(max_leases).__name__}")
        if max_leases is not None and max_leases < 1:
            raise ValueError(f"max_leases must be at least 1, got {max_leases}")
        if table is not None and (not isinstance(table, str) or not table):
            raise ValueError(f"table must be a non-empty str, got {table!r}")
        options = dict(pool_options or {})
        options.setdefault("timeout", connect_timeout)
        self._prefix = prefix
        self._table = table if table is not None else f"{prefix}_fence"
        if pool is None:
            address, secrets = dsn_address(dsn or ""), dsn_secrets(dsn, options)
        else:
            address, secrets = pool_address(pool)
        self._errors = MapErrors(address, secrets, self._table)
        if max_leases is None:
            max_leases = DEFAULT_MAX_LEASES if pool is None else max(1, pool.get_max_size() // 2)
        self._connections = LeaseConnections(
            pool, dsn=dsn, pool_options=options, max_leases=max_leases, errors=self._errors
        )
        self._requests = Requests(prefix, _sql.Statements(quote_table(self._table)), self._errors, self._connections)
        self._permits = Permits(self._requests)
        self._key_of: Callable[[str], Key] = lambda name: advisory_key(prefix, name)
        # Every acquisition of this client from its first request until its
        # release, by hold id: queued, trying, waiting or granted.
        self._holds: dict[str, Hold] = {}
        self._hooks: BackendHooks | None = None
        self._starting: asyncio.Task[None] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> PostgresBackend:
        """A backend with its own pool for ``url`` (closed by ``aclose``).

        ``options`` go to ``asyncpg.create_pool`` (e.g. ``password=``, ``ssl=``).
        URL query parameters: asynclock's own (``table``, ``max_leases``),
        those asyncpg reads (``DSN_PARAMETERS``: ``sslmode``, ``user``, …),
        and server settings, which asyncpg sends to the server
        (``?application_name=app``). A parameter that is none of these but
        looks like a typo of an option (``?max_lease=3``) raises ValueError
        here, before any I/O, naming the closest; so does an unknown keyword
        option. A setting the server does not know fails when connecting,
        with ConfigurationError.
        """
        dsn, query = parse_url(url, options)
        max_leases = query.get("max_leases", max_leases)
        if isinstance(max_leases, str):
            try:
                max_leases = int(max_leases)
            except ValueError as exc:
                raise ValueError(f"bad max_leases: {max_leases!r}") from exc
        return cls(
            dsn=dsn,
            prefix=prefix,
            table=query.get("table", table),
            max_leases=max_leases,
            pool_options=options,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def from_pool(
        cls,
        pool: Any,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> PostgresBackend:
        """A backend on a given ``asyncpg.Pool`` (not closed by ``aclose``).

        Options: ``table=``, ``max_leases=``; any other raises ValueError naming them.
        """
        reject_unknown(options, {"ttl", "prefix", "connect_timeout", "table", "max_leases"}, "an asyncpg pool")
        return cls(pool, prefix=prefix, connect_timeout=connect_timeout, **options)

    @property
    def pool(self) -> Any:
        """The asyncpg pool in use (None before ``start`` when asynclock opens it)."""
        return self._connections.pool

    @property
    def max_leases(self) -> int:
        return self._connections.max_leases

    # -- keys -------------------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Every primitive: the fair lock (the plain lock itself), read-write lock, semaphore."""

    def _main_key(self, ref: LockRef) -> Key:
        """The key a hold of ``ref`` locks (a semaphore: the gate its waiters queue on)."""
        if ref.kind in ("read", "write"):
            return rw_key(self._prefix, ref.name)
        if ref.kind == "semaphore":
            return gate_key(self._prefix, ref.name)
        return self._key_of(ref.name)

    def lock_key(self, ref: LockRef) -> str:
        high, low = self._main_key(ref)
        if ref.kind == "semaphore":
            return f"pg_advisory_gate({high},{low})+{ref.permits} slots"
        return f"pg_advisory({high},{low})"

    def lease_time(self, ttl: float) -> float:
        # The server ends a lease connection idle for ttl (idle_session_timeout),
        # counted from the end of its last statement, which is after that
        # statement was sent.
        return ttl

    # -- starting ---------------------------------------------------------------

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        # The set-up runs in its own task: a caller cancelled meanwhile does
        # not cut a connection attempt in half; the next call waits for the
        # same set-up.
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._set_up())
            task.add_done_callback(_retrieve_outcome)
        await asyncio.shield(task)

    async def _set_up(self) -> None:
        connections = self._connections
        if connections.pool is None:
            await connections.open_pool()
        async with self._errors, connections.borrow() as conn:
            version = int(await conn.fetchval(_sql.SERVER_VERSION))
            self._requests.pg14 = version >= 140000
            await create_table(conn, quote_table(self._table))
        connections.checked = connections.owns_pool and self._requests.pg14

    # -- acquiring --------------------------------------------------------------

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        record = self._holds.get(hold)
        if record is not None:  # the same hold id again
            return Acquired(record.token) if record.granted else Queued(None)
        connections = self._connections
        if connections.pool is None:
            raise BackendUnavailable(_CLOSED)
        record = Hold(ref, hold, ttl)
        if connections.places.locked():
            # Every lease connection is taken: waiting for one is waiting for the lock.
            if not enqueue:
                return Busy(None)
            self._holds[hold] = record
            return Queued(None)
        await connections.places.acquire()  # free: returns at once
        record.has_place = True
        self._holds[hold] = record
        try:
            granted = await self._first_try(record)
        except asyncio.CancelledError:
            raise  # the release by identity that follows gives the connection back
        except BaseException:
            await self._end(record)
            raise
        if granted is not None:
            return granted
        if enqueue:
            return Queued(None)
        await self._end(record)
        return Busy(None)

    async def _first_try(self, record: Hold) -> Acquired | None:
        """Get the hold a connection (a parked one if any) and try once; Acquired, or None."""
        connections = self._connections
        record.conn = connections.take_parked()
        if record.conn is None:
            # Connecting takes what it takes, but leaves a request window of the
            # lease time for the try.
            ttl = record.ttl
            record.conn = await connections.checkout(asyncio.get_running_loop().time() + ttl - request_window(ttl))
        if record.ref.kind == "semaphore":
            granted = await self._permits.try_permit(record)
        else:
            granted = await self._requests.try_lock(record, self._main_key(record.ref))
        if granted is not None:
            self._granted(record, granted)
        return granted

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        record = self._holds.get(hold)
        if record is None or self._connections.pool is None:
            raise BackendUnavailable(_CLOSED)
        if record.granted:
            return Acquired(record.token)
        if not record.has_place:
            try:
                async with asyncio.timeout_at(until):
                    await self._connections.places.acquire()
            except TimeoutError:
                return Queued(None)
            record.has_place = True
        try:
            if record.conn is not None and is_closed(record.conn):
                terminate(record.conn)
                record.forget_session()
            if record.conn is None:
                granted = await self._first_try(record)
                if granted is not None:
                    return granted
            if ref.kind == "semaphore":
                result = await self._permits.wait(record, until)
            else:
                result = await self._requests.wait_lock(record, until)
            if isinstance(result, Acquired):
                self._granted(record, result)
            return result
        except asyncio.CancelledError:
            raise  # the release by identity that follows gives the connection back
        except BaseException:
            # The engine may ask again for the same hold: on a fresh connection.
            conn = record.conn
            if conn is not None:
                statement, args = record.cleanup(self._requests.pg14)
                listener = record.listening()
                record.forget_session()
                await self._connections.give_back(conn, statement, args, ttl, listener)
            raise

    def _granted(self, record: Hold, granted: Acquired) -> None:
        """Record a grant and watch its connection; raises if the connection is already gone."""
        conn = record.conn
        on_close = record.on_close = self._on_close_callback(record.hold)
        with contextlib.suppress(asyncpg.InterfaceError):  # a proxy the pool took back: closed
            conn.add_termination_listener(on_close)
        if is_closed(conn):
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_termination_listener(on_close)
            raise self._errors.unavailable("the connection closed right after the lock was granted")
        record.granted = True
        record.token = granted.token

    def _on_close_callback(self, hold: str) -> Callable[[Any], None]:
        # (It finds the record by its hold id, which no other acquisition
        # shares: no reference cycle for the garbage collector to break.)
        def on_close(_conn: Any) -> None:
            record = self._holds.get(hold)
            if record is None or record.released or record.lost:
                return
            record.lost = True
            if self._hooks is not None:
                self._hooks.lose(
                    [hold], "the PostgreSQL connection holding the lock closed (terminated, restarted or cut off)"
                )

        return on_close

    # -- holding and releasing --------------------------------------------------

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        record = self._holds.get(hold)
        if record is None or not record.granted or record.lost or is_closed(record.conn):
            return False
        record.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        record = self._holds.get(hold)
        if record is None:
            return False
        if not record.granted:
            await self._end(record)  # out of the queue; a grant that raced in goes with it
            return False
        del self._holds[hold]
        record.released = True
        conn = record.conn
        if record.on_close is not None:
            with contextlib.suppress(asyncpg.InterfaceError):  # a proxy the pool took back: closed
                conn.remove_termination_listener(record.on_close)
        alive = not record.lost and not is_closed(conn)
        try:
            ping = record.ping
            if alive and ping is not None and not ping.done():
                # A ping still runs on the connection: give it a moment, else close.
                await asyncio.wait({ping}, timeout=record.ttl / 3)
                if not ping.done():
                    terminate(conn)
            # Whether it goes back clean or is closed (ending the session), the
            # server no longer holds the lock for this hold.
            statement, args = record.cleanup(self._requests.pg14)
            await self._connections.give_back(conn, statement, args, record.ttl, record.listening(), park=True)
        except BaseException:
            terminate(conn)
            raise
        finally:
            self._connections.places.release()
        return alive

    async def _end(self, record: Hold) -> None:
        """An acquisition that holds nothing (any more): give its connection back and its place up."""
        self._holds.pop(record.hold, None)
        record.released = True
        try:
            conn = record.conn
            if conn is not None:
                statement, args = record.cleanup(self._requests.pg14)
                # A try that said no changed nothing: its connection stays for the next try.
                park = statement is None
                await self._connections.give_back(conn, statement, args, record.ttl, record.listening(), park=park)
        finally:
            if record.has_place:
                self._connections.places.release()

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return list(await asyncio.gather(*(self._ping(item.hold) for item in items)))

    async def _ping(self, hold: str) -> bool | BaseException:
        """Prove the lease connection alive with a round trip sent now."""
        record = self._holds.get(hold)
        if record is None or not record.granted or record.lost or is_closed(record.conn):
            return False
        try:
            previous = record.ping
            if previous is not None and not previous.done():
                # An answer to an older ping would prove nothing about now:
                # let it finish, then send a new one.
                with contextlib.suppress(Exception):
                    await asyncio.shield(previous)
            if record.released or record.lost or is_closed(record.conn):
                return False
            record.ping = asyncio.get_running_loop().create_task(record.conn.fetchval(_sql.PING))
            record.ping.add_done_callback(_retrieve_outcome)
            await asyncio.shield(record.ping)
        except CLIENT_ERRORS as exc:
            if record.lost or is_closed(record.conn):
                return False
            translated = self._errors.translate(exc)
            translated.__cause__ = exc
            return translated
        return not record.lost

    # -- what the server knows ----------------------------------------------------

    async def info(self, ref: LockRef) -> LockInfo:
        if self._connections.pool is None:
            raise BackendUnavailable(_CLOSED)
        main = self._main_key(ref)
        if ref.kind == "semaphore":
            highs, lows = slot_arrays(self._prefix, ref.name, ref.permits)
            held_keys = list(zip(highs, lows, strict=True))
        else:
            held_keys = [main]
        async with self._errors, self._connections.borrow() as conn:
            rows = await conn.fetch(
                _sql.LOCKS_ON,
                main[0] & 0xFFFFFFFF,
                main[1] & 0xFFFFFFFF,
                [k[0] & 0xFFFFFFFF for k in held_keys],
                [k[1] & 0xFFFFFFFF for k in held_keys],
            )
            token = await conn.fetchval(self._requests.sql.token_of, fence_row(ref))
        holders, waiters = read_holders(ref, rows, name_check(self._prefix, ref.name))
        owner = holders[0] if holders else None
        count = 0
        if owner is not None:
            mine = self._holds.get(owner)
            count = mine.count if mine is not None and mine.ref.name == ref.name and not mine.lost else 1
        return LockInfo(
            name=ref.name,
            key=self.lock_key(ref),
            owner=owner,
            hold_count=count,
            ttl=None,
            waiters=waiters,
            token=int(token) if owner is not None and token is not None else None,
            holders=tuple(holders),
        )

    async def names(self) -> list[str]:
        """Names under this client's table whose (plain or fair) lock is held right now."""
        if self._connections.pool is None:
            raise BackendUnavailable(_CLOSED)
        async with self._errors, self._connections.borrow() as conn:
            rows = await conn.fetch(self._requests.sql.held_names)
        return [bytes(row["name"]).decode() for row in rows]

    async def aclose(self) -> None:
        # Holds and waits the front could not end: closing their sessions ends them.
        for record in list(self._holds.values()):
            record.released = True
            if record.conn is not None:
                terminate(record.conn)
        self._holds.clear()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        await self._connections.aclose()
