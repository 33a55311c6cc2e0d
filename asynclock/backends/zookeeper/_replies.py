"""What a reply frame answers on its connection: a watch event, a ping, or a request.

A frame is handled in two steps, so that the session learns what it proves
(the last zxid seen, the send time the server acknowledged) before anything
it wakes runs: :func:`take` reads the header and takes the ping or the
request it answers out of the connection's tables; :func:`settle` then fires
the watches of an event, answers the ping, or settles the request's future
with its reply or its error, and says whether the frame reports the session
expired.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

try:
    from aiozk import protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ZooKeeper backend needs aiozk: pip install 'asynclock[zookeeper]'") from exc

from ..._errors import plain
from ._connection import Conn, Pending
from ._wire import (
    AUTH_XID,
    EXISTS_OPCODE,
    NO_NODE,
    PARSERS,
    PING_XID,
    REPLY_HEADER,
    SESSION_EXPIRED,
    SESSION_MOVED,
    STATE_EXPIRED,
    WATCH_XID,
    ZkConnectionLoss,
    error_for,
)

__all__ = ["Reply", "settle", "take"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply frame: its header, its body, and the ping or request in flight it answers."""

    xid: int
    zxid: int
    code: int
    body: bytes
    #: the request it answers (None for an event, a ping, or an xid no longer in flight)
    pending: Pending | None = None
    #: the ping it answers: its send time, and who waits for it
    ping: tuple[float, asyncio.Future[float] | None] | None = None

    @property
    def confirms(self) -> float | None:
        """The send time of what the server answered: the session was alive then.

        An answer of SessionExpired or SessionMoved proves nothing of the kind.
        """
        if self.ping is not None:
            return self.ping[0]
        if self.pending is not None and self.code not in (SESSION_EXPIRED, SESSION_MOVED):
            return self.pending.sent_at
        return None


def take(conn: Conn, frame: bytes) -> Reply:
    """Read ``frame``'s header; take the ping or the request it answers out of ``conn``'s tables."""
    xid, zxid, code = REPLY_HEADER.unpack_from(frame)
    body = frame[REPLY_HEADER.size :]
    if xid == PING_XID:
        return Reply(xid, zxid, code, body, ping=conn.pings.popleft() if conn.pings else None)
    if xid in (WATCH_XID, AUTH_XID):
        return Reply(xid, zxid, code, body)
    return Reply(xid, zxid, code, body, pending=conn.pending.pop(xid, None))


def settle(conn: Conn, reply: Reply) -> str | None:
    """Fire the watches of an event, answer the ping, or settle the request's future.

    Returns why the session is over when the frame says it expired (an
    event, or a request answered SessionExpired), else None.
    """
    if reply.xid == WATCH_XID:
        event = protocol.WatchEvent.deserialize(reply.body)
        if event.type != -1:
            conn.fire(event.type, event.path)
            return None
        return "the server sent a session expired event" if event.state == STATE_EXPIRED else None
    if reply.ping is not None:
        sent, waiter = reply.ping
        if waiter is not None and not waiter.done():
            waiter.set_result(sent)
        return None
    pending = reply.pending
    if pending is None:
        return None  # a credentials' answer, or a request no longer in flight
    if reply.code == SESSION_EXPIRED:
        # Out of the pending table already, so closing the connection will
        # not fail it: answer its caller here, or it would wait forever.
        if not pending.future.done():
            pending.future.set_exception(ZkConnectionLoss("the ZooKeeper session expired"))
            pending.future.exception()  # retrieved: callers may have gone
        return "a request was answered SessionExpired"
    _answer(conn, pending, reply.code, reply.body)
    return None


def _answer(conn: Conn, pending: Pending, code: int, body: bytes) -> None:
    """Settle a request's future: its error, or its parsed reply (and set the watch its success asked for)."""
    future = pending.future
    if code == NO_NODE and pending.opcode == EXISTS_OPCODE and pending.watch is not None:
        conn.watch(*pending.watch, pending.path)  # the server watches for the node's creation
    if code:
        if not future.done():
            future.set_exception(error_for(code, pending.path, conn.host))
            future.exception()  # retrieved: callers may have gone
        return
    if pending.watch is not None:
        conn.watch(*pending.watch, pending.path)
    if future.done():
        return
    parse = PARSERS.get(pending.opcode)
    try:
        if parse is not None:
            reply = parse(body)
        else:
            response_class = protocol.response_xref.get(pending.opcode)
            reply = response_class.deserialize(body) if response_class is not None and body else None
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        future.set_exception(ZkConnectionLoss(f"could not parse a ZooKeeper reply: {plain(exc)}"))
        return
    future.set_result(reply)
