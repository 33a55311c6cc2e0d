"""The servers of a session: whose turn it is, how long one attempt may take, and why each last failed.

A round of connection attempts tries every server once, starting with the
next in turn (the first one at random, so that clients spread over the
ensemble). One attempt, the TCP connect plus the ConnectRequest round trip,
is bounded by the session timeout divided by the number of servers (between
0.2 and 2 s). A round in which every server refused the connection or has a
name that does not resolve is definitive: waiting cannot help.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from collections.abc import Awaitable, Callable

from ..._errors import plain
from ._connection import Conn

__all__ = ["Opener", "Servers", "cause"]

logger = logging.getLogger("asynclock")

#: Opens a session's connection to (host, port) within a budget in seconds;
#: None when the server would not start a session.
Opener = Callable[[str, int, float], Awaitable[Conn | None]]


class Servers:
    """The servers of one session, tried in turn."""

    def __init__(self, hosts: list[tuple[str, int]]) -> None:
        if not hosts:
            raise ValueError("no ZooKeeper servers given")
        self.hosts = list(hosts)
        #: index in ``hosts`` of the server the next attempt tries
        self.next = random.randrange(len(self.hosts))
        #: "host:port" -> why the last attempt to it failed
        self.causes: dict[str, str] = {}

    def __str__(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.hosts)

    def describe(self) -> str:
        """Why each server failed: ``"host:port: cause; …"``."""
        return "; ".join(f"{where}: {cause}" for where, cause in self.causes.items())

    def ran_out(self, timeout: float) -> None:
        """The caller's time ran out: a server still being tried then has timed out."""
        for host, port in self.hosts:
            self.causes.setdefault(f"{host}:{port}", f"timed out after {timeout:.3g} s")

    async def round(self, session_timeout: float, open_one: Opener) -> tuple[Conn | None, bool]:
        """Try each server once with ``open_one``, starting with the next in turn.

        Returns the connection, or None and whether every server's answer was
        definitive (connection refused, name not resolved).
        """
        budget = max(0.2, min(session_timeout / len(self.hosts), 2.0))
        definitive = True
        for _ in range(len(self.hosts)):
            host, port = self.hosts[self.next]
            self.next = (self.next + 1) % len(self.hosts)
            where = f"{host}:{port}"
            try:
                conn = await open_one(host, port, budget)
            except (OSError, TimeoutError, EOFError, asyncio.IncompleteReadError, struct.error) as exc:
                logger.debug("ZooKeeper %s:%d: %s", host, port, plain(exc))
                self.causes[where] = cause(exc, budget)
                definitive = definitive and isinstance(exc, (socket.gaierror, ConnectionRefusedError))
                continue
            except Exception as exc:  # a garbled answer: try the next server, never stop reconnecting
                logger.exception("ZooKeeper %s:%d: unexpected answer to the connect request", host, port)
                self.causes[where] = f"unexpected answer: {plain(exc)}"
                definitive = False
                continue
            if conn is not None:
                self.causes.clear()
                return conn, False
            self.causes[where] = "refused to start a session"
            definitive = False
        return None, definitive


def cause(exc: BaseException, budget: float) -> str:
    """Why a connection attempt failed, in a few words."""
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"timed out after {budget:.3g} s"
    if isinstance(exc, (EOFError, asyncio.IncompleteReadError)):
        return "closed the connection before answering"
    return plain(exc)
