"""PostgresBackend: the request protocol, on advisory locks held by a few shared sessions."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import BackendUnavailable
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, reject_unknown
from ..._values import Leader, LockInfo, LossReason
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from ._config import dsn_address, dsn_secrets, parse_url, pool_address
from ._errors import Translation
from ._hold import Hold
from ._keys import Key, advisory_key, election_key, gate_key, rw_key
from ._listener import Listener
from ._pool import ADMIN_TIMEOUT, Pool
from ._running import Running
from ._tokens import set_up

__all__ = ["DEFAULT_MAX_LEASES", "PostgresBackend"]

#: Sessions for holds when asynclock opens the pool itself (plus one that listens).
DEFAULT_MAX_LEASES = 3

_CLOSED = "the PostgreSQL backend is closed"
_LOST = "the PostgreSQL connection holding the lock closed (terminated, restarted or cut off)"


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class PostgresBackend:
    """Locks on one PostgreSQL server: advisory locks held by a few shared sessions, waiters in a queue table.

    Built in two steps: the pool and the listening session at once (the
    set-up runs on them), the rest (:class:`~._running.Running`) by the
    set-up, with what it found on the server.
    """

    scheme = "postgres"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["postgres"].words

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
        #: A plain lock's key by name, in one place (so that two names can be made to collide).
        self._key_of: Callable[[str], Key] = lambda name: advisory_key(prefix, name)
        self._table = table if table is not None else f"{prefix}_fence"
        if pool is None:
            address, secrets_ = dsn_address(dsn or ""), dsn_secrets(dsn, options)
        else:
            address, secrets_ = pool_address(pool)
        self._errors = Translation(address, secrets_, self._table)
        if max_leases is None:
            max_leases = (
                DEFAULT_MAX_LEASES if pool is None else max(1, min(DEFAULT_MAX_LEASES, pool.get_max_size() // 2))
            )
        self._pool = Pool(pool, dsn=dsn, pool_options=options, max_leases=max_leases, errors=self._errors)
        self._id = secrets.token_hex(8)
        self._listener = Listener(
            self._pool, self._errors, self._id, on_message=self._message, on_lost=self._listener_lost
        )
        #: None: tokens from the sequence where the server has one (PostgreSQL 15+); False: from the table.
        self._sequence_tokens: bool | None = None
        self._hooks: BackendHooks | None = None
        self._starting: asyncio.Task[None] | None = None
        #: The parts the set-up made (None before it, and once closed).
        self._running: Running | None = None

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
        reject_unknown(options, {"table", "max_leases"}, "an asyncpg pool", keywords=True)
        return cls(pool, prefix=prefix, connect_timeout=connect_timeout, **options)

    @property
    def where(self) -> str:
        """The server, as messages name it."""
        return f"PostgreSQL at {self._errors.address}"

    @property
    def pool(self) -> Any:
        """The asyncpg pool in use (None before ``start`` when asynclock opens it)."""
        return self._pool.pool

    @property
    def max_leases(self) -> int:
        """How many sessions may hold locks at once (the listening session comes on top)."""
        return self._pool.max_leases

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
        """Open the pool, read the server, make what is missing of the tables, then build the rest."""
        if self._pool.pool is None:
            await self._pool.open()
        table, tokens = self._table, self._sequence_tokens
        schema = await self._listener.statement(lambda conn: set_up(conn, table, tokens), within=ADMIN_TIMEOUT)
        self._running = Running(
            schema, self._pool, self._listener, self._errors, backend=self._id, prefix=self._prefix, lose=self._lose
        )

    def _running_or_closed(self) -> Running:
        """The parts the set-up made; BackendUnavailable before it and once closed."""
        running = self._running
        if running is None:
            raise BackendUnavailable(_CLOSED)
        return running

    # -- acquiring ----------------------------------------------------------------------

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        running = self._running
        if running is None:
            raise BackendUnavailable(_CLOSED)
        record = running.holds.get(hold)
        if record is not None:  # the same hold id again
            return Acquired(record.token) if record.granted else Queued(None)
        if ref.kind == "election":
            await running.elections.ready()  # (its table, made on the first election's request)
        if running.sessions.client == "?":
            running.sessions.learn_client(hold)
        record = Hold(ref, hold, ttl, running.state(ref, self._main_key(ref)), ref.kind == "read")
        running.holds[hold] = record
        primitive = running.permits if ref.kind == "semaphore" else running.grants
        try:
            got = await primitive.try_acquire(record, enqueue)
        except asyncio.CancelledError:
            raise  # the release by identity that follows settles it
        except BaseException:
            await running.end(record)
            raise
        if got is not None:
            return got
        if enqueue:
            return Queued(None)
        await running.end(record)
        return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        running = self._running_or_closed()
        record = running.holds.get(hold)
        if record is None:
            raise BackendUnavailable(_CLOSED)
        if record.granted:
            return Acquired(record.token)
        primitive = running.permits if ref.kind == "semaphore" else running.grants
        return await running.queue.wait(record, until, primitive.head_try)

    def _message(self, payload: str) -> None:
        """A notification on this backend's channel (before the set-up there is nobody to tell)."""
        if self._running is not None:
            self._running.message(payload)

    def _listener_lost(self) -> None:
        if self._running is not None:
            self._running.listener_lost()

    def _lose(self, holds: list[str], reason: str = _LOST, loss: LossReason = LossReason.CONNECTION_LOST) -> None:
        if self._hooks is not None:
            self._hooks.lose(holds, reason, loss)

    # -- holding and releasing ----------------------------------------------------------

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        running = self._running
        return running is not None and running.set_count(hold, count)

    async def release(self, ref: LockRef, hold: str) -> bool:
        running = self._running
        record = None if running is None else running.holds.get(hold)
        if record is None or running is None:
            return False
        primitive = running.permits if ref.kind == "semaphore" else running.grants
        try:
            return await primitive.release(record)
        finally:
            # A release that failed with the hold still queued is retried: keep it until then.
            if record.released or not (record.marked or record.ticket is not None):
                if record.permits_key is None:
                    running.forget(record)
                else:
                    await running.end(record)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One ping per session (not per hold) proves every hold on it."""
        running = self._running
        if running is None:
            return [False] * len(items)
        return await running.renew(items)

    # -- elections ------------------------------------------------------------------------

    async def leader(self, ref: LockRef) -> Leader | None:
        """The leader of the election ``ref.name``: its row, if its term is live; one read."""
        return await self._running_or_closed().elections.leader(ref)

    def observe(self, ref: LockRef) -> LeaderWatch:
        """A watch on the election's leader: its channel, and its row after each notification."""
        return self._running_or_closed().elections.observe(ref)

    # -- what the server knows ----------------------------------------------------------

    async def info(self, ref: LockRef) -> LockInfo:
        return await self._running_or_closed().info(ref, self._main_key(ref), self.lock_key(ref))

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Ask the holder's client to give the hold up; end the holder's session if it cannot (``_breaking``)."""
        return await self._running_or_closed().breaker.break_lock(ref, self._main_key(ref), self.lock_key(ref), owner)

    async def names(self) -> list[str]:
        """Names under this client's fence table whose (plain or fair) lock is held right now."""
        return await self._running_or_closed().inspector.names()

    async def aclose(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        running, self._running = self._running, None
        if running is not None:
            running.holds.clear()
            running.keys.clear()
        await self._listener.aclose()
        if running is not None:
            running.sessions.close()
        await self._pool.aclose()
