"""Reading a connection where its bytes arrive, once a stream has made it.

A client library's stream (asyncio's ``StreamReader``/``StreamWriter``, as
redis-py and our ZooKeeper handshake use) makes the connection: address,
TLS, credentials, handshake. From then on a reader task would wake for each
reply and then wake whoever waits for it: one event-loop turn too many on a
lock's hand-over. :class:`TakeOver` puts a protocol of ours on the stream's
transport instead, so a reply is handled in the ``data_received`` that
brought its last byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .._errors import plain

__all__ = ["STREAM_BUFFER", "TakeOver"]

#: Where an ``asyncio.StreamReader`` keeps the bytes it read ahead (not public API: see redis/_private.py).
STREAM_BUFFER = "_buffer"


class TakeOver(asyncio.Protocol):
    """A protocol that takes a connected stream's transport over (:meth:`take_over`).

    Subclasses implement ``data_received`` and :meth:`_lost` (the connection
    closed, or the server ended it). The stream's own protocol is still told
    of the close, so that whoever closes the stream (``writer.close()`` and
    ``wait_closed()``, a library's ``disconnect``) is not left waiting.
    """

    _transport: Any = None
    _previous: Any = None

    def take_over(self, reader: Any, writer: asyncio.StreamWriter) -> None:
        """Read ``writer``'s connection from now on, starting with bytes ``reader`` holds already."""
        transport = writer.transport
        self._transport = transport
        self._previous = transport.get_protocol()
        transport.set_protocol(self)
        leftover = bytes(getattr(reader, STREAM_BUFFER, b"") or b"")
        if leftover:
            self.data_received(leftover)

    def _lost(self, why: str) -> None:
        raise NotImplementedError

    def eof_received(self) -> bool:
        self._lost("closed by the server")
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(f"lost: {plain(exc)}" if exc else "closed")
        previous, self._previous = self._previous, None
        if previous is not None:
            with contextlib.suppress(Exception):
                previous.connection_lost(exc)
