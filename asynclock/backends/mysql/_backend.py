"""MySQLBackend: the request protocol, on named locks held by a few shared sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..._errors import BackendUnavailable, LockError
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, whole
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem, unsupported
from .._background import Background
from ._config import Settings, parse_url
from ._election import Elections
from ._errors import Translation, code
from ._grants import Grants
from ._hold import Hold, KeyState, Session
from ._inspect import Inspector
from ._keys import MAX_KEY, election_key, lock_key, marker, semaphore_key, slot_keys, term_key
from ._lines import Lines
from ._requests import Requests
from ._semaphore import Permits
from ._sessions import ADMIN_TIMEOUT, Sessions
from ._sql import Statements

__all__ = ["DEFAULT_MAX_LEASES", "MySQLBackend"]

#: Sessions for holds (waiting sessions come on top, one per line of waiters).
DEFAULT_MAX_LEASES = 3
#: States of keys kept while nothing is on them (a key taken again soon needs no new one).
KEYS_KEPT = 1024

_LOST = "the MySQL session holding the lock closed (killed, timed out, restarted or cut off)"
#: The server's error for a table that does not exist.
_NO_TABLE = 1146


class MySQLBackend:
    """Locks on one MySQL or MariaDB server: named locks (``GET_LOCK``) held by a few shared sessions."""

    scheme = "mysql"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["mysql"].words

    def __init__(
        self,
        settings: Settings,
        *,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if max_leases is not None and (isinstance(max_leases, bool) or not isinstance(max_leases, int)):
            raise TypeError(f"max_leases must be int, not {type(max_leases).__name__}")
        if max_leases is not None and max_leases < 1:
            raise ValueError(f"max_leases must be at least 1, got {max_leases}")
        if table is not None and (not isinstance(table, str) or not table or len(table) > MAX_KEY):
            raise ValueError(f"table must be a non-empty str of at most {MAX_KEY} characters, got {table!r}")
        self._settings = settings
        self._prefix = prefix
        self._table = table if table is not None else f"{prefix}_fence"[:MAX_KEY]
        self._max_leases = DEFAULT_MAX_LEASES if max_leases is None else max_leases
        self._connect_timeout = connect_timeout
        self._errors = Translation(settings.address, settings.secrets, self._table)
        self._sql = Statements(self._table)
        self._background = Background()
        self._hooks: BackendHooks | None = None
        self._starting: asyncio.Task[None] | None = None
        self._parts: _Parts | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> MySQLBackend:
        """A backend for ``url`` (``mysql://user:password@host:3306/database``, or ``mariadb://``).

        Options (keywords, or URL query parameters): ``table`` (the fence
        table, default ``<prefix>_fence``), ``max_leases`` (sessions for
        holds, default 3), ``unix_socket``; keywords only: ``user``,
        ``password``, ``ssl`` (an ``ssl.SSLContext``), ``server_public_key``,
        ``program_name``, which go to asyncmy. Anything else raises
        ValueError naming the valid ones, before any I/O.
        """
        table = options.pop("table", None)
        max_leases = options.pop("max_leases", None)
        settings, query = parse_url(url, options)
        table = query.get("table", table)
        max_leases = query.get("max_leases", max_leases)
        if isinstance(max_leases, str):
            max_leases = whole(max_leases, "max_leases", minimum=1)
        return cls(settings, prefix=prefix, table=table, max_leases=max_leases, connect_timeout=connect_timeout)

    @property
    def max_leases(self) -> int:
        """How many sessions may hold locks at once (waiting sessions come on top)."""
        return self._max_leases

    @property
    def connections(self) -> int:
        """How many server connections the backend has open now (sessions holding, idle, or waiting)."""
        parts = self._parts
        return 0 if parts is None else len(parts.sessions)

    # -- keys -------------------------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """The plain and fair lock (one), semaphores and elections; no read-write lock."""
        if kind in ("read", "write"):
            raise unsupported("mysql", kind, "MySQL's named locks have no shared mode")

    def _main_key(self, ref: LockRef) -> str:
        if ref.kind == "semaphore":
            return semaphore_key(self._prefix, ref.name)
        if ref.kind == "election":
            return election_key(self._prefix, ref.name)
        return lock_key(self._prefix, ref.name)

    def lock_key(self, ref: LockRef) -> str:
        key = self._main_key(ref)
        if ref.kind == "semaphore":
            return f"{key}#0..{ref.permits - 1}"
        return key

    def lease_time(self, ttl: float) -> float:
        # A session's wait_timeout is at least the ttl of every hold it has (in whole seconds,
        # rounded up), counted from the end of its last request, which is after it was sent.
        return ttl

    # -- starting ---------------------------------------------------------------------

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        # The set-up runs in its own task: a caller cancelled meanwhile does not
        # cut a connection attempt in half; the next call waits for the same set-up.
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._set_up())
            task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _set_up(self) -> None:
        """Open the first session, make the fence table if it is missing, then build the rest."""
        if self._parts is None:
            sessions = Sessions(
                self._settings,
                self._errors,
                self._background,
                max_leases=self._max_leases,
                connect_timeout=self._connect_timeout,
                on_lost=self._session_lost,
            )
            self._parts = _Parts(sessions, self._errors, self._sql, self._background, self._prefix)
        requests = self._parts.requests
        session = await requests.sessions.get(1.0)
        try:
            await requests.spawn(self._make_table(requests, session))
        finally:
            if not session.holds:
                requests.sessions.used(session)
        self._parts.ready = True

    async def _make_table(self, requests: Requests, session: Session) -> None:
        sql = self._sql
        try:
            await requests.execute(session, sql.exists, (), ADMIN_TIMEOUT)
        except LockError as exc:
            if exc.__cause__ is None or code(exc.__cause__) != _NO_TABLE:
                raise
            await requests.execute(session, sql.create, (), ADMIN_TIMEOUT)

    def _ready(self) -> _Parts:
        parts = self._parts
        if parts is None or not parts.ready:
            raise BackendUnavailable(f"MySQL at {self._settings.address}: the backend is closed or not started")
        return parts

    def _state(self, parts: _Parts, ref: LockRef) -> KeyState:
        key = self._main_key(ref)
        state = parts.keys.get(key)
        if state is None or (ref.kind == "semaphore" and len(state.slots) != ref.permits and state.idle):
            slots = slot_keys(self._prefix, ref.name, ref.permits) if ref.kind == "semaphore" else ()
            term = term_key(self._prefix, ref.name) if ref.kind == "election" else None
            state = parts.keys[key] = KeyState(key, marker(key), slots, term)
        return state

    # -- acquiring --------------------------------------------------------------------

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        parts = self._ready()
        record = parts.holds.get(hold)
        if record is not None:  # the same hold id again
            return Acquired(record.token) if record.granted else Queued(None)
        record = Hold(ref, hold, ttl, self._state(parts, ref))
        parts.holds[hold] = record
        primitive = parts.permits if ref.kind == "semaphore" else parts.grants
        # (in a task of its own: cancelled, the caller leaves it to finish and record what it got)
        task, done = parts.requests.start(primitive.try_acquire(record, enqueue))
        record.pending = task
        try:
            got = await done
        except asyncio.CancelledError:
            raise  # the release by identity that follows waits for the try, and settles it
        except BaseException:
            parts.forget(record)
            raise
        finally:
            if task.done():
                record.pending = None
        if got is not None:
            return got
        if record.queued:
            return Queued(None)
        parts.forget(record)
        return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        parts = self._ready()
        record = parts.holds.get(hold)
        if record is None:
            raise BackendUnavailable(f"MySQL at {self._settings.address}: the backend is closed")
        if record.granted:
            return Acquired(record.token)
        return await parts.lines.wait(record, until)

    def _session_lost(self, session: Session) -> None:
        """A session closed: exactly its holds are lost."""
        lost = [record for record in session.holds if record.granted and not record.lost]
        for record in lost:
            record.lost = True
            record.state.holders.pop(record.hold, None)
        session.holds.clear()
        if lost and self._hooks is not None:
            self._hooks.lose([record.hold for record in lost], _LOST)

    # -- holding and releasing --------------------------------------------------------

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        parts = self._parts
        record = None if parts is None else parts.holds.get(hold)
        if record is None or not record.granted or record.lost or record.session is None or record.session.gone:
            return False
        record.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        parts = self._parts
        record = None if parts is None else parts.holds.get(hold)
        if record is None or parts is None:
            return False
        pending = record.pending
        if pending is not None and not pending.done():
            await asyncio.shield(pending)  # (its try, or its grant: what it got is released below)
        primitive = parts.permits if ref.kind == "semaphore" else parts.grants
        try:
            return await parts.requests.spawn(primitive.release(record))
        finally:
            if record.released or not (record.queued or record.granted):
                parts.forget(record)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One ping per session (not per hold) proves every hold on it."""
        parts = self._parts
        if parts is None:
            return [False] * len(items)
        return await parts.renew(items)

    # -- elections ----------------------------------------------------------------------

    async def leader(self, ref: LockRef) -> Leader | None:
        """The leader of the election ``ref.name``: its row, if its term is live; one read."""
        return await self._ready().elections.leader(ref)

    def observe(self, ref: LockRef) -> LeaderWatch:
        """A watch on the election's leader: its term key's release, and its row after it."""
        return self._ready().elections.observe(ref)

    # -- what the server knows ----------------------------------------------------------

    async def info(self, ref: LockRef) -> LockInfo:
        parts = self._ready()
        slots = slot_keys(self._prefix, ref.name, ref.permits) if ref.kind == "semaphore" else ()
        return await parts.inspector.info(ref, self._main_key(ref), self.lock_key(ref), slots)

    async def names(self) -> list[str]:
        """Names of plain locks under this client's prefix that an asynclock client holds right now."""
        return await self._ready().inspector.names()

    async def aclose(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        parts, self._parts = self._parts, None
        if parts is not None:
            parts.close()
        await self._background.aclose(ADMIN_TIMEOUT)


class _Parts:
    """A started backend's parts, and the records they share: this client's holds (by hold id)
    and the keys it asks for."""

    def __init__(
        self, sessions: Sessions, errors: Translation, sql: Statements, background: Background, prefix: str
    ) -> None:
        self.ready = False
        self.keys: dict[str, KeyState] = {}
        self.holds: dict[str, Hold] = {}
        self.sessions = sessions
        self.requests = Requests(sessions, errors, sql)
        self.lines = Lines(self.requests, background)
        self.grants = Grants(self.requests, self.lines)
        self.permits = Permits(self.requests, self.lines, self.grants, prefix)
        self.elections = Elections(self.requests, background, prefix)
        self.inspector = Inspector(self.requests, self.keys, prefix)

    def forget(self, record: Hold) -> None:
        """Forget ``record``; past ``KEYS_KEPT`` keys, the states of keys nothing is on any more go too."""
        if self.holds.get(record.hold) is record:
            del self.holds[record.hold]
        keys = self.keys
        if len(keys) > KEYS_KEPT:
            for key in [key for key, state in keys.items() if state.idle]:
                del keys[key]

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One ping per session (not per hold) proves every hold on it."""
        pings: dict[Session, asyncio.Future[bool | BaseException]] = {}
        for item in items:
            record = self.holds.get(item.hold)
            session = record.session if record is not None and record.granted and not record.lost else None
            if session is not None and session not in pings and not session.gone:
                pings[session] = self.requests.loop.create_task(self.sessions.ping(session, item.ttl))
        if pings:
            await asyncio.wait(list(pings.values()))
        results: list[bool | BaseException] = []
        for item in items:
            record = self.holds.get(item.hold)
            if record is None or not record.granted or record.lost or record.session not in pings:
                results.append(False)
                continue
            outcome = pings[record.session].result()
            results.append(outcome if isinstance(outcome, BaseException) else (outcome and not record.lost))
        return results

    def close(self) -> None:
        self.lines.close()
        self.holds.clear()
        self.keys.clear()
        self.sessions.close()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
