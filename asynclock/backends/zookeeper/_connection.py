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

from ._wire import FRAME_SIZE, PING_XID, REPLY_HEADER, ZkConnectionLoss

__all__ = ["Conn", "Handshake", "Pending", "WatchCallback", "handshake"]

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

    async def read_frame(self) -> bytes:
        """The next reply frame; ValueError for a length no server sends."""
        (size,) = FRAME_SIZE.unpack(await self.reader.readexactly(FRAME_SIZE.size))
        if not REPLY_HEADER.size <= size <= _MAX_FRAME:
            raise ValueError(f"bad frame length {size} from {self.host}")
        return await self.reader.readexactly(size)

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
