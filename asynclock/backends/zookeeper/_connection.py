"""One TCP connection of a ZooKeeper session: the handshake, its frames, its requests in flight.

Nothing here is ever re-sent: a connection that drops fails every request
in flight with :class:`ZkConnectionLoss` and the caller decides.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from aiozk import protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ZooKeeper backend needs aiozk: pip install 'asynclock[zookeeper]'") from exc

from ..._errors import plain
from .._takeover import TakeOver
from ._wire import FRAME_SIZE, PING_XID, REPLY_HEADER, ZkConnectionLoss

__all__ = ["Conn", "Frames", "Handshake", "Pending", "WatchCallback", "handshake"]

logger = logging.getLogger("asynclock")

_EVENT_DELETED, _EVENT_CHILDREN = 2, 4

#: Largest reply accepted (ZooKeeper's own jute.maxbuffer default is 1 MiB).
_MAX_FRAME = 64 * 1024 * 1024

#: A watch's callback, called once with ``"deleted"`` (the node went),
#: ``"event"`` (any other change) or ``"disconnected"`` (the watch is gone
#: with its connection: read again after the reconnect).
WatchCallback = Callable[[str], None]


@dataclass(eq=False)
class Pending:
    """A request in flight: who waits for it, when it was sent, and the watch its success sets."""

    future: asyncio.Future[Any]
    sent_at: float
    opcode: int
    path: str
    watch: tuple[str, WatchCallback] | None = None


@dataclass(eq=False)
class Conn:
    """An established connection: its requests and pings in flight, in the order the server answers them."""

    seq: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    host: str
    last_recv: float
    last_send: float
    pending: dict[int, Pending] = field(default_factory=dict)
    pings: collections.deque[tuple[float, asyncio.Future[float] | None]] = field(default_factory=collections.deque)
    #: (kind, path) -> callbacks; a watch belongs to the connection that set it
    watches: dict[tuple[str, str], list[WatchCallback]] = field(default_factory=dict)
    dead: bool = False

    def watch(self, kind: str, callback: WatchCallback, path: str) -> None:
        """Register a one-shot watch callback (``"data"`` or ``"child"``) the server has set on ``path``."""
        self.watches.setdefault((kind, path), []).append(callback)

    def unwatch(self, kind: str, path: str, callback: WatchCallback) -> None:
        callbacks = self.watches.get((kind, path))
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del self.watches[(kind, path)]

    def fire(self, event_type: int, path: str) -> None:
        """A watch event for ``path``: run (and forget) the callbacks it triggers."""
        kinds: tuple[str, ...]
        if event_type == _EVENT_DELETED:
            kinds = ("data", "child")
        elif event_type == _EVENT_CHILDREN:
            kinds = ("child",)
        else:
            kinds = ("data",)
        what = "deleted" if event_type == _EVENT_DELETED else "event"
        for kind in kinds:
            for callback in self.watches.pop((kind, path), []):
                _run_callback(callback, what)

    def write(self, payload: bytes) -> None:
        """Send one frame (raises OSError or RuntimeError on a closed transport)."""
        self.writer.write(FRAME_SIZE.pack(len(payload)) + payload)

    def write_ping(self, now: float, future: asyncio.Future[float] | None) -> None:
        self.pings.append((now, future))
        self.last_send = now
        self.write(protocol.PingRequest().serialize(PING_XID))

    def unanswered_for(self, now: float) -> float:
        """How long the oldest request or ping in flight has gone without a reply since (0: none in flight)."""
        oldest = min([p.sent_at for p in self.pending.values()] + [sent for sent, _ in self.pings], default=None)
        return 0.0 if oldest is None else now - max(oldest, self.last_recv)

    def close(self, reason: str) -> None:
        """Close the socket and fail whatever is in flight (its outcome unknown)."""
        self.dead = True
        self.writer.close()
        with contextlib.suppress(Exception):
            self.writer.transport.abort()
        error = ZkConnectionLoss(f"ZooKeeper connection lost: {reason}")
        futures: list[asyncio.Future[Any] | None] = [p.future for p in self.pending.values()]
        futures += [future for _, future in self.pings]
        self.pending.clear()
        self.pings.clear()
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: callers may have gone
        watches, self.watches = self.watches, {}
        for callbacks in watches.values():
            for callback in callbacks:
                _run_callback(callback, "disconnected")


class Frames(TakeOver):
    """The reader of an established connection: each reply frame is handled where its bytes arrive.

    After the handshake (read as a stream) the transport gets this protocol,
    so a reply or a watch event reaches whoever waits for it within the
    event-loop turn that brought it, not one turn later through a reader
    task. ``ended`` gets the reason once nothing more can be read: the
    connection closed, a frame length no server sends, or a frame
    ``on_frame`` could not handle (it is logged).
    """

    def __init__(self, host: str, on_frame: Callable[[bytes], None]) -> None:
        self._host = host
        self._on_frame = on_frame
        self._buffer = bytearray()
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    @classmethod
    def attach(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, on_frame: Callable[[bytes], None]
    ) -> Frames:
        """Read ``writer``'s connection with a new ``Frames`` from now on (bytes the stream holds first)."""
        self = cls(host, on_frame)
        self.take_over(reader, writer)
        return self

    def _end(self, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result(reason)

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        buffer = self._buffer
        buffer += data
        pos = 0
        head = FRAME_SIZE.size
        transport = self._transport
        while len(buffer) - pos >= head and not transport.is_closing():
            (size,) = FRAME_SIZE.unpack_from(buffer, pos)
            if not REPLY_HEADER.size <= size <= _MAX_FRAME:
                self._end(f"bad frame length {size} from {self._host}")
                return
            if len(buffer) - pos - head < size:
                break
            frame = bytes(buffer[pos + head : pos + head + size])
            pos += head + size
            try:
                self._on_frame(frame)
            except Exception as exc:  # a garbled frame: this connection cannot be trusted
                logger.exception("ZooKeeper %s: bad reply", self._host)
                self._end(f"bad reply: {plain(exc)}")
                return
        del buffer[:pos]

    def _lost(self, why: str) -> None:
        self._end(f"connection to {self._host} {why}")


@dataclass(frozen=True, slots=True)
class Handshake:
    """What a server answered to the ConnectRequest, and when that request was sent."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    answer: Any
    sent: float


async def handshake(host: str, port: int, budget: float, request: Any) -> Handshake:
    """Connect and send the ConnectRequest ``request``; the whole exchange is bounded by ``budget`` seconds."""
    loop = asyncio.get_running_loop()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(budget):
            reader, writer = await asyncio.open_connection(host, port)
            payload = request.serialize()
            sent = loop.time()
            writer.write(FRAME_SIZE.pack(len(payload)) + payload)
            (size,) = FRAME_SIZE.unpack(await reader.readexactly(FRAME_SIZE.size))
            # a closed connection here is a refusal (the server is not
            # serving, or is behind our last zxid), never an expiry
            answer = protocol.ConnectResponse.deserialize(await reader.readexactly(size))
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    return Handshake(reader, writer, answer, sent)


def _run_callback(callback: WatchCallback, what: str) -> None:
    try:
        callback(what)
    except Exception:
        logger.exception("ZooKeeper watch callback failed")
