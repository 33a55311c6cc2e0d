"""Requests on a ZooKeeper session's current connection: sent at once, never queued, never re-sent.

A request sent while disconnected fails at once with :class:`ZkConnectionLoss`,
and so does every request in flight when the connection drops: whether the
server applied it is for the caller to find out (the recipe finds its node
by its GUID). Replies come back in the order the requests were sent, which
is what lets the recipe pipeline a create and the read of its siblings.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..._errors import plain
from ._connection import Conn, Pending, WatchCallback
from ._wire import ZkConnectionLoss

__all__ = ["Requests"]


class Requests:
    """Sending on the current connection (``_conn``) of a session: requests, pings, watches.

    The session (:class:`._session.ZkSession`) sets ``_conn`` and
    ``_closed`` and tears a connection down (``_drop``) when a write fails.
    """

    def __init__(self) -> None:
        self._conn: Conn | None = None
        self._closed = False
        #: the last request id used; ids are the session's, across its connections
        self._xid = 0

    def _drop(self, conn: Conn, reason: str) -> None:
        """Tear ``conn`` down: fail its requests in flight (the session's part)."""
        raise NotImplementedError

    def _current(self) -> Conn:
        conn = self._conn
        if conn is None or conn.dead or self._closed:
            raise ZkConnectionLoss("not connected to ZooKeeper")
        return conn

    def _send(
        self, conn: Conn, request: Any, path: str, watch: tuple[str, WatchCallback] | None = None
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        self._xid = self._xid + 1 if self._xid < 2**31 - 1 else 1
        xid = self._xid
        payload = request.serialize(xid)
        future: asyncio.Future[Any] = loop.create_future()
        now = loop.time()
        conn.pending[xid] = Pending(future, now, int(request.opcode), path, watch)
        conn.last_send = now
        try:
            conn.write(payload)
        except (OSError, RuntimeError) as exc:
            self._drop(conn, f"write failed: {plain(exc)}")
        return future

    async def call(self, request: Any, path: str = "", watch: tuple[str, WatchCallback] | None = None) -> Any:
        """Send ``request`` now on the current connection and return the reply.

        Raises ZkConnectionLoss at once when disconnected (nothing is queued
        or re-sent), ZkError for an error reply. ``watch`` = (kind, callback)
        registers a one-shot watch callback on ``path`` if the reply is a
        success (kind ``"data"`` for exists/get_data, ``"child"`` for
        get_children).
        """
        return await self._send(self._current(), request, path, watch)

    def submit(
        self, request: Any, path: str = "", watch: tuple[str, WatchCallback] | None = None
    ) -> asyncio.Future[Any]:
        """Like :meth:`call` but returns the future at once (requests pipelined)."""
        return self._send(self._current(), request, path, watch)

    async def ping(self) -> float:
        """One round trip; returns the send time that the server acknowledged."""
        conn = self._current()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._write_ping(conn, future)
        return await future

    def _write_ping(self, conn: Conn, future: asyncio.Future[float] | None) -> None:
        try:
            conn.write_ping(asyncio.get_running_loop().time(), future)
        except (OSError, RuntimeError) as exc:
            self._drop(conn, f"write failed: {plain(exc)}")

    def unwatch(self, kind: str, path: str, callback: WatchCallback) -> None:
        """Forget a watch callback that is no longer wanted (the server's watch stays, harmless)."""
        if self._conn is not None:
            self._conn.unwatch(kind, path, callback)
