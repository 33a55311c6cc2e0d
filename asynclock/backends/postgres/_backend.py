"""PostgresBackend: the request protocol, on advisory locks held by a few shared sessions."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from ..._errors import BackendUnavailable
from ..._options import DEFAULT_CONNECT_TIMEOUT, reject_unknown
from ..._timing import request_window
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from . import _sql
from ._config import dsn_address, dsn_secrets, parse_url, pool_address
from ._election import Elections
from ._errors import CLIENT_ERRORS, MapErrors
from ._grants import Grants
from ._hold import Hold, KeyState
from ._inspect import Inspector
from ._keys import Key, advisory_key, election_key, gate_key, rw_key, slot_arrays
from ._listener import Listener
from ._queue import Queue
from ._requests import Requests
from ._semaphore import Permits, SemaphoreStatements
from ._sessions import ADMIN_TIMEOUT, Session, Sessions, is_closed
from ._tokens import FIRST_TOKEN, quote_table, set_up

__all__ = ["DEFAULT_MAX_LEASES", "PostgresBackend"]

#: Sessions for holds when asynclock opens the pool itself (plus one that listens).
DEFAULT_MAX_LEASES = 3
#: States of keys kept while nothing is on them (a key taken again soon needs no new one).
KEYS_KEPT = 1024

_CLOSED = "the PostgreSQL backend is closed"
_LOST = "the PostgreSQL connection holding the lock closed (terminated, restarted or cut off)"
_fetchval = asyncpg.Connection.fetchval


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class PostgresBackend:
    """Locks on one PostgreSQL server: advisory locks held by a few shared sessions, waiters in a queue table."""

    scheme = "postgres"

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
            address, secrets_ = dsn_address(dsn or ""), dsn_secrets(dsn, options)
        else:
            address, secrets_ = pool_address(pool)
        self._errors = MapErrors(address, secrets_, self._table)
        if max_leases is None:
            max_leases = (
                DEFAULT_MAX_LEASES if pool is None else max(1, min(DEFAULT_MAX_LEASES, pool.get_max_size() // 2))
            )
        self._sessions = Sessions(pool, dsn=dsn, pool_options=options, max_leases=max_leases, errors=self._errors)
        self._id = secrets.token_hex(8)
        self._sessions.backend = self._id
        self._listener = Listener(self._sessions, self._errors, self._id)
        self._requests = Requests(self._sessions, self._errors)
        self._queue = Queue(self._requests, self._listener, self._sessions)
        self._elections = Elections(self._requests, self._listener, self._sessions, self._errors, prefix)
        self._grants = Grants(self._requests, self._queue, self._sessions, self._listener, self._elections)
        self._permits = Permits(self._requests, self._queue, self._sessions, self._listener, prefix)
        self._key_of: Callable[[str], Key] = lambda name: advisory_key(prefix, name)
        # What this client asks for, by key, and every acquisition from its first request to its end.
        self._keys: dict[Key, KeyState] = {}
        self._holds: dict[str, Hold] = {}
        self._inspector = Inspector(self._listener, self._sessions, self._keys, prefix)
        #: None: tokens from the sequence where the server has one (PostgreSQL 15+); False: from the table.
        self._sequence_tokens: bool | None = None
        self._hooks: BackendHooks | None = None
        self._starting: asyncio.Task[None] | None = None
        self._sessions.on_lost = self._session_lost
        self._listener.on_message = self._message
        self._listener.on_lost = self._listener_lost

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
        return self._sessions.pool

    @property
    def max_leases(self) -> int:
        """How many sessions may hold locks at once (the listening session comes on top)."""
        return self._sessions.max_leases

    # -- keys -------------------------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Every primitive: the fair lock (the plain lock itself), read-write lock, semaphore, leader election."""

    def _main_key(self, ref: LockRef) -> Key:
        """The key a hold of ``ref`` takes (a semaphore: the gate its waiters queue on)."""
        if ref.kind in ("read", "write"):
            return rw_key(self._prefix, ref.name)
        if ref.kind == "semaphore":
            return gate_key(self._prefix, ref.name)
        if ref.kind == "election":
            return election_key(self._prefix, ref.name)
        return self._key_of(ref.name)

    def lock_key(self, ref: LockRef) -> str:
        high, low = self._main_key(ref)
        if ref.kind == "semaphore":
            return f"pg_advisory_gate({high},{low})+{ref.permits} slots"
        return f"pg_advisory({high},{low})"

    def lease_time(self, ttl: float) -> float:
        # A session's idle_session_timeout is at least the ttl of every hold it
        # has (counted from the end of its last statement, which is after that
        # statement was sent).
        return ttl

    # -- starting ---------------------------------------------------------------------

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        # The set-up runs in its own task: a caller cancelled meanwhile does not
        # cut a connection attempt in half; the next call waits for the same set-up.
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._set_up())
            task.add_done_callback(_retrieve_outcome)
        await asyncio.shield(task)

    async def _set_up(self) -> None:
        sessions = self._sessions
        sessions.loop = asyncio.get_running_loop()
        if sessions.pool is None:
            await sessions.open_pool()
        table, queue = quote_table(self._table), quote_table(self._table, "_queue")

        async def prepare(conn: Any) -> None:
            version = int(await conn.fetchval(_sql.SERVER_VERSION))
            sessions.pg14 = version >= 140000
            use_sequence = version >= 150000 if self._sequence_tokens is None else self._sequence_tokens
            sequence = quote_table(self._table, "_token") if use_sequence else None
            await set_up(conn, table, queue, sequence)
            first = FIRST_TOKEN.format(table=table)
            self._requests.sql = self._inspector.sql = _sql.Statements(table, queue, sequence, first)
            self._requests.table, self._requests.sequence = table, sequence
            self._permits.sql = SemaphoreStatements(table, queue, sequence, first)
            self._elections.leaders, self._elections.queue = quote_table(self._table, "_leaders"), queue

        await self._listener.statement(prepare, within=ADMIN_TIMEOUT)

    # -- acquiring ----------------------------------------------------------------------

    def _state(self, ref: LockRef) -> KeyState:
        key = self._main_key(ref)
        state = self._keys.get(key)
        if state is None or (ref.kind == "semaphore" and len(state.slots) != ref.permits and state.idle):
            slots: frozenset[Key] = frozenset()
            if ref.kind == "semaphore":
                highs, lows = slot_arrays(self._prefix, ref.name, ref.permits)
                slots = frozenset(zip(highs, lows, strict=True))
            state = self._keys[key] = KeyState(key, slots)
        return state

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        record = self._holds.get(hold)
        if record is not None:  # the same hold id again
            return Acquired(record.token) if record.granted else Queued(None)
        if self._sessions.pool is None:
            raise BackendUnavailable(_CLOSED)
        if ref.kind == "election":
            await self._elections.ready()  # (its table, made on the first election's request)
        if self._sessions.client == "?":
            self._sessions.client = hold.partition(":")[0]  # (the front's hold ids start with the client's id)
        record = Hold(ref, hold, ttl, self._state(ref), ref.kind == "read")
        self._holds[hold] = record
        primitive = self._permits if ref.kind == "semaphore" else self._grants
        try:
            got = await primitive.try_acquire(record, enqueue)
        except asyncio.CancelledError:
            raise  # the release by identity that follows settles it
        except BaseException:
            await self._end(record)
            raise
        if got is not None:
            return got
        if enqueue:
            return Queued(None)
        await self._end(record)
        return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        record = self._holds.get(hold)
        if record is None or self._sessions.pool is None:
            raise BackendUnavailable(_CLOSED)
        if record.granted:
            return Acquired(record.token)
        primitive = self._permits if ref.kind == "semaphore" else self._grants
        return await self._queue.wait(record, until, primitive.head_try)

    def _message(self, payload: str) -> None:
        """A notification on this backend's channel."""
        kind, _, rest = payload.partition(" ")
        if kind in ("t", "h"):
            record = self._holds.get(rest)
            if record is not None and not record.granted and record.woken is not None:
                if kind == "t":
                    record.try_now = True
                else:
                    record.head = True
                record.woken.set()
        elif kind == "i":
            self._inspector.asked(rest, self._sessions.spawn)
        elif kind == "r":
            self._inspector.answered(rest)

    def _listener_lost(self) -> None:
        """The listening session ended: its waiters' rows are dead; they queue again."""
        for record in self._holds.values():
            if record.woken is not None and not record.granted:
                record.woken.set()
        self._elections.wake_all()

    def _session_lost(self, session: Session) -> None:
        """A session closed: exactly its holds are lost."""
        lost = [record for record in session.holds if record.granted and not record.lost]
        for record in session.holds:
            self._grants.forget(record)
        session.holds.clear()
        for state in self._keys.values():
            if session in state.unknown:
                state.unknown.remove(session)  # its locks ended with it
        if lost and self._hooks is not None:
            self._hooks.lose([record.hold for record in lost], _LOST)
        leaders = [record for record in lost if record.ref.kind == "election"]
        if leaders:
            self._elections.lost(leaders)

    # -- holding and releasing ----------------------------------------------------------

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        record = self._holds.get(hold)
        if record is None or not record.granted or record.lost or record.session is None or record.session.gone:
            return False
        record.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        record = self._holds.get(hold)
        if record is None:
            return False
        primitive = self._permits if ref.kind == "semaphore" else self._grants
        try:
            return await primitive.release(record)
        finally:
            # A release that failed with the hold still queued is retried: keep it until then.
            if record.released or not (record.marked or record.ticket is not None):
                if record.permits_key is None:
                    self._forget(record)
                else:
                    await self._end(record)

    async def _end(self, record: Hold) -> None:
        """``record`` is over: out of the queue, its permits key let go of, forgotten."""
        if record.marked or record.ticket is not None:
            await self._queue.leave(record)
        if record.permits_key is not None:
            # (at once: while it is held, the client's number of permits is in use)
            key, record.permits_key = record.permits_key, None
            await self._listener.let_go(key, request_window(record.ttl))
        self._forget(record)

    def _forget(self, record: Hold) -> None:
        """Forget ``record``; past ``KEYS_KEPT`` keys, the states of keys nothing is on any more go too."""
        if self._holds.get(record.hold) is record:
            del self._holds[record.hold]
        keys = self._keys
        if len(keys) > KEYS_KEPT:
            for key in [key for key, state in keys.items() if state.idle]:
                del keys[key]

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One ping per session (not per hold) proves every hold on it."""
        sessions: dict[Session, asyncio.Future[bool | BaseException]] = {}
        for item in items:
            record = self._holds.get(item.hold)
            session = record.session if record is not None and record.granted and not record.lost else None
            if session is not None and session not in sessions and not session.gone:
                sessions[session] = asyncio.ensure_future(self._ping(session))
        if sessions:
            await asyncio.wait(list(sessions.values()))
        results: list[bool | BaseException] = []
        for item in items:
            record = self._holds.get(item.hold)
            if record is None or not record.granted or record.lost or record.session not in sessions:
                results.append(False)
                continue
            outcome = sessions[record.session].result()
            results.append(outcome if isinstance(outcome, BaseException) else (outcome and not record.lost))
        return results

    async def _ping(self, session: Session) -> bool | BaseException:
        """Prove ``session`` alive with a round trip sent in its turn."""
        try:
            await session.enter()
            try:
                if session.gone or is_closed(session.conn):
                    return False
                await session.conn.fetchval(_sql.PING)
            finally:
                session.leave()
        except CLIENT_ERRORS as exc:
            if session.gone or is_closed(session.conn):
                return False
            translated = self._errors.translate(exc)
            translated.__cause__ = exc
            return translated
        return not session.gone

    # -- elections ------------------------------------------------------------------------

    async def leader(self, ref: LockRef) -> Leader | None:
        """The leader of the election ``ref.name``: its row, if its term is live; one read."""
        if self._sessions.pool is None:
            raise BackendUnavailable(_CLOSED)
        return await self._elections.leader(ref)

    def observe(self, ref: LockRef) -> LeaderWatch:
        """A watch on the election's leader: its channel, and its row after each notification."""
        return self._elections.observe(ref)

    # -- what the server knows ----------------------------------------------------------

    async def info(self, ref: LockRef) -> LockInfo:
        if self._sessions.pool is None:
            raise BackendUnavailable(_CLOSED)
        main = self._main_key(ref)
        if ref.kind == "semaphore":
            highs, lows = slot_arrays(self._prefix, ref.name, ref.permits)
            held = list(zip(highs, lows, strict=True))
        else:
            held = [main]
        return await self._inspector.info(ref, main, held, self.lock_key(ref))

    async def names(self) -> list[str]:
        """Names under this client's fence table whose (plain or fair) lock is held right now."""
        if self._sessions.pool is None:
            raise BackendUnavailable(_CLOSED)
        return await self._inspector.names()

    async def aclose(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        self._holds.clear()
        self._keys.clear()
        await self._listener.aclose()
        await self._sessions.aclose()
