"""The requests of a lock or a read-write side on its lease connection: the try, the wait, the proofs.

A try is one statement: it takes the lock, the fencing token and the hold's
session settings at once (``_sql.TRY_LOCK``). A wait is one statement that
blocks in the server's own lock queue (``_sql.WAIT_LOCK``) until granted or
until ``lock_timeout``, in the caller's task: when the caller is cancelled,
asyncpg cancels the statement on the server (the next statement on the
connection waits for that), and the hold's release gives the connection
back, undoing whatever the statement got.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from ..._timing import request_window
from ...abc import Acquired, Queued
from . import _sql
from ._connections import CHECK_INTERVAL_MS, NO_COMMAND_TIMEOUT, LeaseConnections, is_closed
from ._errors import MapErrors
from ._hold import Hold, ms
from ._keys import Key, app_name, fence_row

__all__ = ["Requests"]


class Requests:
    """The statements of one backend's holds, sent on their lease connections."""

    def __init__(self, prefix: str, sql: _sql.Statements, errors: MapErrors, connections: LeaseConnections) -> None:
        self.prefix = prefix
        self.sql = sql
        self.errors = errors
        self.connections = connections
        #: PostgreSQL 14+: idle_session_timeout, client_connection_check_interval.
        self.pg14 = True

    def idle(self, ttl: float) -> str | None:
        """The idle_session_timeout of a lease connection (None where the server has none)."""
        return ms(ttl) if self.pg14 else None

    # -- a lock, or a side of a read-write lock ---------------------------------

    async def try_lock(self, record: Hold, key: Key) -> Acquired | None:
        """The one try of a new hold: Acquired, or None if somebody else holds the lock."""
        ref = record.ref
        record.args = (
            key[0],
            key[1],
            fence_row(ref),
            app_name(self.prefix, ref.name, record.hold),
            self.idle(record.ttl),
        )
        shared = ref.kind == "read"
        sent = asyncio.get_running_loop().time()
        row = await self.try_statement(record, self.sql.try_lock, shared)
        if row is None or not row["ok"]:
            return None
        record.before = (row["app0"], row["idle0"])
        return Acquired(int(row["token"]), confirmed_at=sent)

    async def wait_lock(self, record: Hold, until: float | None) -> Acquired | Queued:
        """Wait in the server's queue until granted, or ``until`` (then Queued: the wait has ended)."""
        await self.arm_check(record)
        sent = asyncio.get_running_loop().time()
        shared = record.ref.kind == "read"
        row = await self.wait_statement(
            record, until, self.sql.wait_lock, *record.args, self._lock_timeout(until), shared
        )
        if row is None or not row["ok"]:
            return Queued(None)
        record.before = (row["app0"], row["idle0"])
        return await self.confirm(record, int(row["token"]), sent)

    # -- shared by every primitive ----------------------------------------------

    async def try_statement(self, record: Hold, statement: str, *extra: Any) -> Any:
        """Run a try statement on the hold's connection: its row, or None when it waited for a fence row.

        A try waits for nothing but a fence row another transaction holds
        (an application's ``SELECT ... FOR UPDATE``, another prefix sharing
        the table): for half a request window. Then whatever it locked is
        unlocked again (its settings went with its transaction), and the
        connection is clean. The request is watched: unanswered within a
        request window, the connection is closed.
        """
        conn = record.conn
        ttl = record.ttl
        loop = asyncio.get_running_loop()
        sent = loop.time()
        connections = self.connections
        record.dirty = True
        with self.errors:
            try:
                window = request_window(ttl)
                connections.watch(conn, sent + window)
                try:
                    row = await conn.fetchrow(
                        statement, *record.args, ms(window / 2), *extra, timeout=connections.hot_timeout
                    )
                finally:
                    connections.unwatch(conn)
            except asyncpg.LockNotAvailableError:
                row = None
            else:
                if row[0] is not None and row[0] is not False:
                    return row  # granted: the hold's release undoes it
            if row is None:
                async with asyncio.timeout_at(loop.time() + ttl):
                    await conn.execute(_sql.UNLOCK_ALL)
        record.dirty = False  # refused: nothing locked, nothing set
        return row

    async def wait_statement(self, record: Hold, until: float | None, statement: str, *args: Any) -> Any:
        """Run a blocking statement: its row, or None when ``lock_timeout`` ended the wait.

        The server is probed while it waits (``LeaseConnections.wait_started``):
        a server that went silent ends the wait with a BackendUnavailable
        that is not to be retried. With ``until``, the connection is closed
        should the server not end the wait by then (plus a grace).
        """
        conn = record.conn
        loop = asyncio.get_running_loop()
        connections = self.connections
        grace = max(0.1, request_window(record.ttl))
        record.dirty = True
        connections.wait_started(conn, record.ttl)
        if until is not None:
            connections.watch(conn, until + grace)
        try:
            with self.errors:
                try:
                    return await conn.fetchrow(statement, *args, timeout=NO_COMMAND_TIMEOUT)
                except asyncpg.LockNotAvailableError:
                    return None  # lock_timeout: the server ended the wait
        except Exception as exc:
            if conn in connections.silenced:
                error = self.errors.unavailable("stopped answering while the lock was awaited")
                error.retryable = False
                raise error from exc
            if until is not None and is_closed(conn) and loop.time() >= until + grace:
                raise self.errors.unavailable("no answer within the acquire timeout") from exc
            raise
        finally:
            connections.wait_ended(conn)
            connections.unwatch(conn)

    async def arm_check(self, record: Hold) -> None:
        """Before a wait on a connection without it: set client_connection_check_interval.

        A waiting session does not read its socket: without this check a
        waiter whose client is gone (crashed, or closed the connection) stays
        queued as a ghost until its turn comes. The server arms the check when
        a statement starts, so it is set beforehand (one more round trip, on
        the waiting path of a given pool only; asynclock's own pool sets it
        once per connection).
        """
        if self.connections.checked or not self.pg14 or record.reset_check:
            return
        record.dirty = True
        record.reset_check = True
        async with self.errors, asyncio.timeout(record.ttl):
            await record.conn.execute(_sql.SET_CHECK_INTERVAL.format(ms=CHECK_INTERVAL_MS))

    async def confirm(self, record: Hold, token: int, sent: float) -> Acquired:
        """The grant of a wait sent at ``sent``, with a send time the lease may count from."""
        loop = asyncio.get_running_loop()
        confirmed = sent
        if loop.time() - sent > record.ttl / 3:
            # A long wait: the grant's own send time is too old to count the
            # lease from. One ping on the lease connection, sent now, proves it.
            confirmed = loop.time()
            async with self.errors, asyncio.timeout_at(confirmed + record.ttl):
                await record.conn.fetchval(_sql.PING)
        return Acquired(token, confirmed_at=confirmed)

    @staticmethod
    def _lock_timeout(until: float | None) -> str:
        if until is None:
            return "0"
        return ms(max(until - asyncio.get_running_loop().time(), 0.001))
