"""The PostgreSQL harness for the contract suite (and the PostgreSQL-only tests).

Isolation is by prefix: every test gets its own key space and its own fence
table (``<prefix>_fence``, with its queue table, token sequence and leaders
table), dropped at the end. A hold is lost server-side the way PostgreSQL
loses one: the holder's session is ended with ``pg_terminate_backend``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Collection
from typing import Any

import asyncpg

import asynclock
from asynclock.backends.postgres import PostgresBackend, advisory_key, election_key, rw_key, slot_key
from asynclock.backends.postgres._keys import Key
from asynclock.backends.postgres._listener import Listener
from asynclock.backends.postgres._running import Running
from tests.harnesses import Harness
from tests.servers.postgres import PASSWORD_GROUP, PostgresServer

#: Granted advisory locks in the two-int space, with the holder's pid and application_name.
HELD_SQL = """
    SELECT l.classid::int8 AS classid, l.objid::int8 AS objid, l.pid, a.application_name AS app
    FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
"""


def unsigned(key: tuple[int, int]) -> tuple[int, int]:
    """A two-int key as pg_locks shows it (classid, objid are unsigned oids)."""
    return key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF


def postgres_backend(locks: asynclock.Locks) -> PostgresBackend:
    backend = locks.backend
    assert isinstance(backend, PostgresBackend)
    return backend


def pg_listener(locks: asynclock.Locks) -> Listener:
    """The PostgreSQL client's listening session (its notifications, and the liveness of its queue rows)."""
    return postgres_backend(locks)._listener


def pg_running(locks: asynclock.Locks) -> Running | None:
    """The PostgreSQL client's sessions and requests once it is connected (None before)."""
    return postgres_backend(locks)._running


def share_key(locks: asynclock.Locks, names: Collection[str], key: Key) -> None:
    """Put these lock names of the client on the one advisory ``key`` (a collision); other names keep their own."""
    backend = postgres_backend(locks)
    real = backend._key_of
    backend._key_of = lambda name: key if name in names else real(name)


def tokens_from(locks: asynclock.Locks, source: str) -> asynclock.Locks:
    """``locks``, made (before its first request) to take its fencing tokens from ``source``:
    "sequence" (PostgreSQL 15+) or "table" (the per-name counter rows of older servers)."""
    postgres_backend(locks)._sequence_tokens = source == "sequence"
    return locks


class PostgresHarness(Harness):
    kind = "postgres"
    can_pause = True

    def __init__(self, server: PostgresServer) -> None:
        super().__init__()
        self.server = server
        self._admin: Any = None
        self._terminations: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return self.server.url

    async def admin(self) -> Any:
        """A plain connection of the test's own (not a lock client's)."""
        if self._admin is None or self._admin.is_closed():
            self._admin = await asyncpg.connect(self.server.dsn)
        return self._admin

    async def holder_pid(self, name: str) -> int | None:
        """The backend pid of the session that holds ``name`` (None: free)."""
        want = unsigned(advisory_key(self.prefix, name))
        for row in await (await self.admin()).fetch(HELD_SQL):
            if (row["classid"], row["objid"]) == want:
                return int(row["pid"])
        return None

    async def expire(self, name: str) -> bool:
        """End the holder's session (``pg_terminate_backend``) a moment after returning.

        The client hears of a terminated session at once (its connection
        closes), so a termination awaited here could cancel the caller's
        ``async with`` body while it is still inside this call; like an
        expiry on the server, it lands a moment later instead.
        """
        pid = await self.holder_pid(name)
        if pid is None:
            return False
        task = asyncio.get_running_loop().create_task(self._terminate(pid))
        self._terminations.add(task)
        task.add_done_callback(self._terminations.discard)
        return True

    async def expire_shape(self, kind: str, name: str) -> bool:
        """End the sessions holding the primitive ``kind`` of ``name`` (as ``expire`` does).

        A semaphore's holders are looked for in its first 16 slots.
        """
        if kind == "fair":  # the plain lock itself
            return await self.expire(name)
        if kind in ("read", "write"):
            keys = {unsigned(rw_key(self.prefix, name))}
        elif kind == "election":
            keys = {unsigned(election_key(self.prefix, name))}
        else:
            keys = {unsigned(slot_key(self.prefix, name, slot)) for slot in range(16)}
        pids = {
            int(row["pid"])
            for row in await (await self.admin()).fetch(HELD_SQL)
            if (row["classid"], row["objid"]) in keys
        }
        for pid in pids:
            task = asyncio.get_running_loop().create_task(self._terminate(pid))
            self._terminations.add(task)
            task.add_done_callback(self._terminations.discard)
        return bool(pids)

    async def _terminate(self, pid: int) -> None:
        conn = await asyncpg.connect(self.server.dsn)
        try:
            await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await conn.close()

    async def queued_on(self, key: tuple[int, int]) -> int:
        """How many live waiters the queue table holds for the advisory ``key`` (a row is live
        while its client's listening session holds the row's session key)."""
        return len(await self.queue_rows(key))

    async def queue_rows(self, key: tuple[int, int]) -> list[bool]:
        """The live rows queued for ``key``, first first: whether each is a shared (read) hold."""
        table = f"{self.prefix}_fence_queue".replace('"', '""')
        admin = await self.admin()
        if not await admin.fetchval("SELECT to_regclass($1) IS NOT NULL", f'"{table}"'):
            return []
        rows = await admin.fetch(
            f'SELECT q.shared FROM "{table}" q WHERE q.k1 = $1 AND q.k2 = $2'
            " AND NOT pg_try_advisory_xact_lock_shared(q.s1, q.s2) ORDER BY q.ticket",
            *key,
        )
        return [bool(row["shared"]) for row in rows]

    async def lock_waits(self) -> int:
        """Sessions waiting in the server's own lock queue for an advisory lock (asynclock never makes one)."""
        admin = await self.admin()
        return int(await admin.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"))

    async def leftovers(self) -> list[str]:
        """Advisory locks still granted to a session of one of this test's clients.

        Covers every primitive: a read-write lock's key, a semaphore's slots
        and its gate are advisory locks of the holder's (or waiter's) session too.
        """
        return await self.granted_to(*self._clients)

    async def granted_to(self, *clients: asynclock.Locks) -> list[str]:
        """Advisory locks granted to a session of one of ``clients``."""
        ids = {locks.client_id for locks in clients}
        left = []
        for row in await (await self.admin()).fetch(HELD_SQL):
            app = row["app"] or ""
            if any(client_id in app for client_id in ids):
                left.append(f"({row['classid']},{row['objid']}) held by pid {row['pid']} ({app})")
        return left

    async def close(self) -> None:
        if self.server.running:
            self.server.resume()
        if self._terminations:
            await asyncio.wait(list(self._terminations), timeout=10)
        admin = await self.admin()
        try:
            table = f"{self.prefix}_fence".replace('"', '""')
            await admin.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_queue", "{table}_leaders"')
            await admin.execute(f'DROP SEQUENCE IF EXISTS "{table}_token"')
        finally:
            await admin.close()
            self._admin = None


@contextlib.asynccontextmanager
async def password_role(pg: PostgresHarness) -> AsyncIterator[tuple[str, str]]:
    """A role of this harness that logs in with a password: (name, password); dropped at the end."""
    admin = await pg.admin()
    await admin.execute(
        f"DO $$ BEGIN CREATE ROLE {PASSWORD_GROUP} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    name, password = f"{pg.prefix}_user", f"pw-{secrets.token_hex(8)}"
    await admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {PASSWORD_GROUP}")
    try:
        yield name, password
    finally:
        admin = await pg.admin()
        await admin.execute(f"DROP OWNED BY {name}")
        await admin.execute(f"DROP ROLE {name}")
