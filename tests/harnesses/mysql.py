"""The MySQL harness for the contract suite (and the MySQL-only tests), on a MariaDB server.

Isolation is by prefix: every test gets its own key space and its own fence
table (``<prefix>_fence``), dropped at the end. A hold is lost server-side
the way MySQL loses one: the session holding it is ended with ``KILL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import asyncmy

import asynclock
from asynclock.backends.mysql import MySQLBackend, election_key, lock_key, semaphore_key, term_key
from asynclock.backends.mysql._backend import _Parts
from tests.harnesses import Harness
from tests.servers.mysql import DATABASE, MariaDBServer


def mysql_backend(locks: asynclock.Locks) -> MySQLBackend:
    backend = locks.backend
    assert isinstance(backend, MySQLBackend)
    return backend


def mysql_parts(locks: asynclock.Locks) -> _Parts | None:
    """The MySQL client's sessions, lines and holds once it is connected (None before)."""
    return mysql_backend(locks)._parts


def session_ids(locks: asynclock.Locks) -> list[int]:
    """The server's connection ids of the client's open sessions."""
    parts = mysql_parts(locks)
    return [] if parts is None else [session.id for session in parts.sessions.sessions if not session.gone]


class MySQLHarness(Harness):
    kind = "mysql"
    can_pause = True
    server_counts = False  # the hold count lives in the client

    def __init__(self, server: MariaDBServer) -> None:
        super().__init__()
        self.server = server
        self._admin: Any = None
        self._kills: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def table(self) -> str:
        return f"{self.prefix}_fence"

    async def admin(self) -> Any:
        """A plain connection of the test's own (not a lock client's), autocommit."""
        if self._admin is None or not self._admin.connected:
            self._admin = await asyncmy.connect(
                host="127.0.0.1", port=self.server.port, user="root", database=DATABASE, autocommit=True
            )
        return self._admin

    async def query(self, statement: str, args: Any = None) -> tuple[tuple[Any, ...], ...]:
        """Rows of ``statement`` on the admin connection (a new one if the server closed it)."""
        for attempt in (1, 2):
            try:
                cursor = (await self.admin()).cursor()
                await cursor.execute(statement, args)
                rows: tuple[tuple[Any, ...], ...] = await cursor.fetchall()
                return rows
            except (asyncmy.errors.OperationalError, asyncmy.errors.InterfaceError) as exc:
                if attempt == 2 or not (isinstance(exc, asyncmy.errors.InterfaceError) or exc.args[0] in (2006, 2013)):
                    raise
                self._admin.close()
                self._admin = None
        raise AssertionError("unreachable")

    async def holder_id(self, key: str) -> int | None:
        """The connection id of the session holding ``key`` (None: free)."""
        ((holder,),) = await self.query("SELECT IS_USED_LOCK(%s)", (key,))
        return None if holder is None else int(holder)

    def kill_soon(self, connection: int) -> None:
        """End a session with ``KILL`` a moment after returning (a session the client sees end at
        its next request, like an expiry on the server)."""
        task = asyncio.get_running_loop().create_task(self.kill(connection))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)

    async def kill(self, connection: int) -> None:
        with contextlib.suppress(asyncmy.errors.OperationalError):  # (gone already)
            await self.query("KILL %s", (connection,))

    async def expire(self, name: str) -> bool:
        """End the session holding ``name`` (``KILL``): its locks go at once."""
        holder = await self.holder_id(lock_key(self.prefix, name))
        if holder is None:
            return False
        self.kill_soon(holder)
        return True

    async def expire_shape(self, kind: str, name: str) -> bool:
        """End the sessions holding the primitive ``kind`` of ``name`` (as ``expire`` does).

        A semaphore's holders are looked for in its first 16 slots.
        """
        if kind in ("lock", "fair"):
            return await self.expire(name)
        if kind == "election":
            keys = [election_key(self.prefix, name)]
        else:
            keys = [f"{semaphore_key(self.prefix, name)}#{slot}" for slot in range(16)]
        holders = {holder for key in keys if (holder := await self.holder_id(key)) is not None}
        for holder in holders:
            self.kill_soon(holder)
        return bool(holders)

    async def leftovers(self) -> list[str]:
        """Keys of this test's fence table (locks, elections with their term keys, semaphore slots)
        still held by some session, and sessions still waiting for them."""
        if not await self._has_table():
            return []
        rows = await self.query(f"SELECT k, kind, name, IS_USED_LOCK(k) FROM `{self.table}`")
        left = [f"{key} ({kind}) held by connection {holder}" for key, kind, _n, holder in rows if holder is not None]
        for _key, kind, name, _holder in rows:
            if kind == "e":
                term = term_key(self.prefix, name)
                holder = await self.holder_id(term)
                if holder is not None:
                    left.append(f"term key {term} held by connection {holder}")
        waiting = await self.query(
            "SELECT ID, INFO FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"
            " AND INFO LIKE '/*asynclock wait%%'"
        )
        keys = {key for key, *_rest in rows}
        left += [f"connection {ident} waits: {info}" for ident, info in waiting if any(k in info for k in keys)]
        return left

    async def _has_table(self) -> bool:
        rows = await self.query(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (DATABASE, self.table),
        )
        return bool(rows)

    async def close(self) -> None:
        if self.server.running:
            self.server.resume()
        if self._kills:
            await asyncio.wait(list(self._kills), timeout=10)
        try:
            await self.query(f"DROP TABLE IF EXISTS `{self.table}`")
        finally:
            if self._admin is not None:
                self._admin.close()
                self._admin = None


@contextlib.asynccontextmanager
async def mysql_user(harness: MySQLHarness, privileges: str = "ALL") -> AsyncIterator[tuple[str, str]]:
    """A user of this harness that logs in with a password and has ``privileges`` on the test
    database: (name, password); dropped at the end."""
    name, password = f"{harness.prefix}_u"[:32], f"pw-{secrets.token_hex(8)}"
    await harness.query(f"CREATE USER '{name}'@'127.0.0.1' IDENTIFIED BY '{password}'")
    try:
        if privileges:
            await harness.query(f"GRANT {privileges} ON {DATABASE}.* TO '{name}'@'127.0.0.1'")
        yield name, password
    finally:
        await harness.query(f"DROP USER IF EXISTS '{name}'@'127.0.0.1'")
