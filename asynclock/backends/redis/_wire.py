"""The hot path's requests: RESP encoded here, sent on connections of our own.

An acquire and a release are one script call each; through redis-py's
generic command path (pool checkout with its lock and events, retry
wrapper, reply callbacks) a call costs about as much client time again as
the round trip itself. :class:`Lanes` keeps connections made with the
client's own settings (the same class, address, credentials, TLS, timeouts),
takes a free one per request, writes the pre-encoded command and reads the
reply. A connection whose request did not end with a whole reply
(cancelled, timed out, broken) is closed, never reused. At most the client
pool's ``max_connections`` are open at once; more requests wait for one.

Arguments are encoded as UTF-8 (redis-py's default encoding).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Sequence
from typing import Any

try:
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

__all__ = ["Lanes", "bulk", "evalsha", "unbulk"]

Arg = str | int | bytes


def bulk(value: Arg) -> bytes:
    """One RESP bulk string."""
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, int):
        value = b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(value), value)


def unbulk(value: bytes) -> bytes:
    """The value of one RESP bulk string made by :func:`bulk`."""
    return value[value.index(b"\r\n") + 2 : -2]


def evalsha(sha: bytes, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA sha numkeys keys… args…`` from bulk strings already encoded (:func:`bulk`)."""
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n%s" % (3 + len(keys) + len(args), sha, bulk(len(keys)))
    return head + b"".join(keys) + b"".join(args)


async def _dirty(conn: Any) -> bool:
    """Whether an idle connection was closed by the server or has unread data."""
    try:
        return bool(await conn.can_read())
    except (redis_errors.ConnectionError, OSError):
        return True


class Lanes:
    """Connections of our own to the client's server, one per request in flight."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._free: list[Any] = []
        self._open = 0
        self._limit: int = getattr(pool, "max_connections", None) or 2**31
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def request(self, command: bytes, replies: int = 1) -> list[Any]:
        """Send ``command`` (``replies`` commands, pipelined) and read each reply.

        An error reply is returned in its place (redis-py's exception), not
        raised; a failed connection raises redis-py's error.
        """
        conn = self._free.pop() if self._free else await self._take()
        try:
            if conn.is_connected and await _dirty(conn):
                # Closed by the server meanwhile (a restart, CLIENT KILL, an idle
                # timeout), or holding bytes nobody asked for: a fresh one.
                await conn.disconnect(nowait=True)
            if not conn.is_connected:
                await conn.connect()  # (a Sentinel's connection asks the sentinels where to)
            await conn.send_packed_command(command)
            answers: list[Any] = []
            while len(answers) < replies:
                try:
                    answers.append(await conn.read_response())
                except redis_errors.ResponseError as error:  # a whole reply: the connection is fine
                    answers.append(error)
                    if not conn.is_connected:
                        # (closed on purpose by its class: a Sentinel's connection after
                        # READONLY, to ask the sentinels again) the rest had the same fate
                        answers += [error] * (replies - len(answers))
        except BaseException:
            # The reply was not read (cancelled, timed out, broken): what follows
            # on this connection is unknown, so it is closed, never reused.
            await self._drop(conn, nowait=True)
            raise
        if self._closed:
            await self._drop(conn)
        else:
            self._free.append(conn)
            self._wake()
        return answers

    async def _drop(self, conn: Any, *, nowait: bool = False) -> None:
        self._open -= 1
        self._wake()
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=nowait)

    async def _take(self) -> Any:
        while self._open >= self._limit:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if self._free:
                return self._free.pop()
        self._open += 1
        pool = self._pool
        settings = dict(pool.connection_kwargs)
        if settings.get("socket_connect_timeout") is None:
            settings["socket_connect_timeout"] = settings.get("socket_timeout")
        # Every request is bounded by its caller (the acquire's deadline, the
        # lease's); a socket timeout would put a task of its own (asyncio.wait_for)
        # under every write.
        settings["socket_timeout"] = None
        return pool.connection_class(**settings)

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close the free connections now, and those in use once their request ends."""
        self._closed = True
        free, self._free = self._free, []
        for conn in free:
            await self._drop(conn)
