"""A subscribed connection read where its bytes arrive: the hand-over's wake-up path.

A waiter is woken by a message on its client's pub/sub connection. Read
through redis-py, a message would wake a reader task first (the stream's
buffer, then the parser's coroutines), and that task would wake the
waiter: one event-loop turn and a parser more than needed. Here redis-py
makes the connection (address, Sentinel's resolution, TLS, credentials,
handshake), then :func:`Subscribed.attach` puts a protocol of ours on its
transport: each reply is parsed in ``data_received`` and handed to the
listener's callback there, so a hand-over wakes its waiter within the same
turn as the bytes arrive.

RESP2 only (the connection is made with ``protocol=2``): in subscribed mode
every reply is an array (``message``, ``subscribe``, ``pong``, their
sharded forms), or an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

try:
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from .._takeover import TakeOver
from ._private import READER, WRITER

__all__ = ["Subscribed", "parse_reply"]

#: What a listener does with each reply (an array of bytes, ints and nested arrays).
OnReply = Callable[[Any], None]

_INCOMPLETE: Any = object()


def parse_reply(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply of ``buf`` from ``pos``: (value, position after it).

    The value is ``_INCOMPLETE`` when ``buf`` does not hold the whole reply
    yet; an error reply is redis-py's exception for it (returned, not raised).
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    after = end + 2
    if kind == 0x24:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, after
        stop = after + size
        if len(buf) < stop + 2:
            return _INCOMPLETE, pos
        return bytes(buf[after:stop]), stop + 2
    if kind == 0x2A:  # * array
        count = int(line)
        if count < 0:
            return None, after
        items: list[Any] = []
        for _ in range(count):
            item, after = parse_reply(buf, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    if kind == 0x3A:  # : integer
        return int(line), after
    if kind == 0x2B:  # + simple string
        return line, after
    if kind == 0x2D:  # - error
        return _error(line.decode("utf-8", "replace")), after
    raise redis_errors.InvalidResponse(f"unexpected reply type {chr(kind)!r} on a subscribed connection")


def _error(text: str) -> redis_errors.RedisError:
    """redis-py's exception for an error reply (so that the backend's edge maps it as for any request)."""
    try:
        from redis._parsers.base import BaseParser
    except ImportError:  # pragma: no cover - another redis-py layout
        return redis_errors.ResponseError(text)
    error = BaseParser.parse_error(text)  # type: ignore[no-untyped-call]
    return error if isinstance(error, redis_errors.RedisError) else redis_errors.ResponseError(text)


class Subscribed(TakeOver):
    """The protocol of a connected redis-py connection that only listens from now on.

    ``on_reply`` is called with each reply, in order, as it arrives. The
    connection's end, an error reply, or bytes that are not RESP end
    :meth:`watch` with the error; the connection stays redis-py's to close
    (its ``disconnect``), and its own protocol is told of the close.
    """

    def __init__(self, on_reply: OnReply) -> None:
        self._on_reply = on_reply
        self._buffer = bytearray()
        loop = asyncio.get_running_loop()
        self._loop = loop
        #: Set (with the reason) once the connection cannot be read any more.
        self._ended: asyncio.Future[BaseException] = loop.create_future()
        #: Loop time of the last bytes received, and how many replies came.
        self.seen = loop.time()
        self.replies = 0

    @classmethod
    def attach(cls, conn: Any, on_reply: OnReply) -> Subscribed:
        """Read ``conn`` (a redis-py asyncio connection, connected) with a new ``Subscribed``."""
        writer = getattr(conn, WRITER, None)
        reader = getattr(conn, READER, None)
        if writer is None:
            raise redis_errors.ConnectionError("the pub/sub connection is not connected")
        self = cls(on_reply)
        self.take_over(reader, writer)
        return self

    # -- the transport's calls ------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._ended.done():
            return
        self.seen = self._loop.time()
        buffer = self._buffer
        buffer += data
        pos = 0
        try:
            while pos < len(buffer):
                reply, after = parse_reply(buffer, pos)
                if reply is _INCOMPLETE:
                    break
                pos = after
                if isinstance(reply, redis_errors.RedisError):
                    self._end(reply)
                    return
                self.replies += 1
                self._on_reply(reply)
        except (ValueError, IndexError, redis_errors.InvalidResponse) as exc:
            self._end(redis_errors.InvalidResponse(f"unreadable reply on a subscribed connection: {exc}"))
            return
        except Exception as exc:  # noqa: BLE001 - a listener's failure ends this connection, not the loop
            self._end(exc)
            return
        del buffer[:pos]

    def _lost(self, why: str) -> None:
        self._end(redis_errors.ConnectionError(f"pub/sub connection {why}"))

    def pause_writing(self) -> None:
        """A few commands at most are written: nothing to hold back."""

    def resume_writing(self) -> None:
        pass

    # -- ours --------------------------------------------------------------------------

    def _end(self, error: BaseException) -> None:
        if not self._ended.done():
            self._ended.set_result(error)

    def send(self, *args: bytes | str) -> None:
        """Write one command; raise redis-py's ConnectionError if the connection is ending."""
        transport = self._transport
        if self._ended.done() or transport is None or transport.is_closing():
            raise redis_errors.ConnectionError("the pub/sub connection is closed")
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            value = arg.encode() if isinstance(arg, str) else arg
            parts.append(b"$%d\r\n%s\r\n" % (len(value), value))
        transport.write(b"".join(parts))

    async def watch(self, interval: Callable[[], float]) -> None:
        """Until the connection ends: raise why. After ``interval()`` seconds without
        a reply a PING goes out, and no reply within another ``interval()`` ends it (a
        connection that died without a FIN is noticed within twice that)."""
        loop = self._loop
        ended = self._ended
        pinged_at: float | None = None
        while True:
            every = interval()
            wait = self.seen + every - loop.time()
            if wait <= 0:
                if pinged_at is not None and self.seen < pinged_at:
                    raise redis_errors.ConnectionError(f"no answer to a health check within {every:.3g} s")
                pinged_at = loop.time()
                self.send(b"PING")
                wait = every
            done, _ = await asyncio.wait((ended,), timeout=wait)
            if done:
                raise ended.result()
