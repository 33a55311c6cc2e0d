"""One ZooKeeper session, on aiozk's wire format, with our own life cycle.

aiozk (0.32) serialises the rarer requests and replies (``aiozk.protocol``);
the connection, the session and the watches are ours, for what a lock needs:

* a dropped connection (EOF) is torn down at once, failing every request
  in flight with :class:`ZkConnectionLoss`; nothing is ever re-sent (a
  duplicate sequential node): the caller decides, and the recipe finds its
  node by its GUID;
* only an explicit ``session_id == 0`` / ``timeout <= 0`` in a
  ConnectResponse means the session expired, never a connection closed
  before answering;
* every connection attempt (TCP connect plus the ConnectRequest round trip)
  is bounded by the session timeout divided by the number of servers
  (:mod:`._servers`), and rounds are spaced by at most half a second;
* every watch belongs to its connection: on disconnect its callback runs
  with ``"disconnected"`` and its owner reads again;
* Create2 answers with the stat (czxid and ephemeralOwner in one round trip);
* ``close()`` is bounded, and every error is asynclock's (:mod:`._wire`).

This module keeps the session's state: its identity (id, password,
negotiated timeout), its life cycle, the current connection, liveness and
expiry. Sending on the current connection is :mod:`._requests`' part, one
connection's frames and requests in flight :mod:`._connection`'s, what a
reply frame answers :mod:`._replies`'.

The first connection is bounded by the caller's time, and gives up at once
when every server refused the connection or has a name that does not
resolve: then nothing keeps reconnecting in the background. A session that
was established keeps reconnecting until it is closed (it may come back).
Credentials (``auth``, e.g. ZooKeeper's ``digest`` scheme) are sent on every
connection, right behind the ConnectRequest's answer.

Liveness: ``confirmed_at`` is the send time (``loop.time()``) of the last
request of this session that the server answered. The server cannot expire
the session before ``confirmed_at + timeout`` (it received that request
later than we sent it), which is what the lock's trusted deadline counts from.
A connection on which a request goes unanswered for a third of the session
timeout is given up and another server is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence

try:
    from aiozk import protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ZooKeeper backend needs aiozk: pip install 'asynclock[zookeeper]'") from exc

from ..._errors import LockError
from ..._timing import Backoff
from ._connection import Conn, Frames, WatchCallback, handshake
from ._replies import settle, take
from ._requests import Requests
from ._servers import Servers
from ._wire import AUTH_XID, FRAME_SIZE, ZkConnectionLoss

__all__ = ["WatchCallback", "ZkSession"]

logger = logging.getLogger("asynclock")

#: Longest pause between two rounds of connection attempts, in seconds.
_MAX_ROUND_PAUSE = 0.5


class ZkSession(Requests):
    """A ZooKeeper session kept alive across connections to any server of ``hosts``.

    Callbacks: ``on_connected()`` after every (re)connection of a live
    session, ``on_disconnected(reason)`` when the connection of a live
    session is lost (it may still be alive: it reconnects),
    ``on_expired(session_id)`` when the server reports that session expired
    (a new one is then created), ``keepalive()`` whether the session should
    ping by itself while idle (the lock backend turns this off while it holds
    locks: then the lease watchdog's renewals are the heartbeat, so a stalled
    watchdog lets the session, and the lock, go).
    """

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        timeout: float,
        on_connected: Callable[[], None] = lambda: None,
        on_expired: Callable[[int], None] = lambda sid: None,
        on_disconnected: Callable[[str], None] = lambda reason: None,
        keepalive: Callable[[], bool] = lambda: True,
        auth: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        super().__init__()
        self._servers = Servers(hosts)
        #: (scheme, credentials) sent on every connection, e.g. ("digest", b"user:password")
        self._auth = list(auth)
        self.requested_timeout = timeout
        self.on_connected = on_connected
        self.on_expired = on_expired
        self.on_disconnected = on_disconnected
        self.keepalive = keepalive
        self.session_id = 0
        self._password = b"\x00" * 16
        #: negotiated session timeout in seconds (the requested one until connected)
        self.timeout = timeout
        self.last_zxid = 0
        self.confirmed_at = 0.0
        self.reconnects = 0
        self._conn_seq = 0
        self._connected = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        #: whether a session was ever established (then it keeps reconnecting)
        self._established = False
        #: why the first connection was given up (every server refused or unknown)
        self._unreachable: str | None = None
        self._last_host = ""

    # -- life cycle ------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.dead

    @property
    def connection_seq(self) -> int:
        """Changes with every new connection (watches belong to one connection)."""
        return self._conn_seq

    @property
    def address(self) -> str:
        """The server of the current connection (else the last one used, else every server)."""
        conn = self._conn
        if conn is not None:
            return conn.host
        return self._last_host or str(self._servers)

    async def start(self, timeout: float) -> None:
        """Connect (bounded by ``timeout``); BackendUnavailable if no server answered.

        Until a first connection is made, the attempts end with this call: when
        ``timeout`` has passed, or at once when every server refused the
        connection or has a name that does not resolve; the message names each
        server and why. A session that was established keeps reconnecting in
        the background until it is closed.
        """
        if self._closed:
            raise ZkConnectionLoss("the ZooKeeper session is closed")
        if self._runner is None:
            self._unreachable = None
            self._servers.causes.clear()
            self._connected.clear()
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="asynclock-zookeeper-session")
        try:
            await self.wait_connected(timeout)
        except BaseException as exc:
            if self._established or self._closed:
                raise
            # Never connected (out of time, every server refused, or the caller
            # was cancelled): stop trying, so that nothing reconnects behind the
            # caller's back; the next call starts again.
            runner, self._runner = self._runner, None
            if runner is not None and not runner.done():
                runner.cancel()
                if isinstance(exc, ZkConnectionLoss):
                    with contextlib.suppress(asyncio.CancelledError):
                        await runner
            if not isinstance(exc, ZkConnectionLoss):
                raise
            reason = self._unreachable
            if reason is None:
                self._servers.ran_out(timeout)
                reason = f"no ZooKeeper server answered within {timeout:.3g} s: {self._servers.describe()}"
            raise ZkConnectionLoss(reason) from exc.__cause__

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Return once connected; ZkConnectionLoss after ``timeout`` seconds."""
        if self._closed:
            raise ZkConnectionLoss("the ZooKeeper session is closed")
        if self.connected:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise ZkConnectionLoss(f"no ZooKeeper server of {self._servers} answered within {timeout:.3g}s") from None
        if self._closed:
            raise ZkConnectionLoss("the ZooKeeper session is closed")
        if self._unreachable is not None and not self.connected:
            raise ZkConnectionLoss(self._unreachable)

    async def close(self, timeout: float) -> None:
        """Close the session (its ephemeral nodes go at once), bounded by ``timeout``."""
        if self._closed:
            return
        self._closing = True
        conn = self._conn
        if conn is not None and not conn.dead and self.session_id and timeout > 0:
            with contextlib.suppress(LockError, TimeoutError, OSError):
                async with asyncio.timeout(timeout):
                    await self._send(conn, protocol.CloseRequest(), "")
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        if self._conn is not None:
            self._drop(self._conn, "closed")
        self._connected.set()  # wake waiters so they see the session closed

    # -- the connection loop -----------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff(cap=_MAX_ROUND_PAUSE)
        while not self._closed and not self._closing:
            conn, definitive = await self._servers.round(self.timeout, self._open)
            if conn is None:
                if definitive and not self._established:
                    # Every server refused, or has no address: waiting cannot help.
                    self._unreachable = f"no ZooKeeper server could be reached: {self._servers.describe()}"
                    self._connected.set()  # wake the caller of start(), which sees why
                    return
                await asyncio.sleep(backoff.next() * random.uniform(0.5, 1.0))
                continue
            backoff.reset()
            self._established = True
            self._conn = conn
            self._last_host = conn.host
            self._connected.set()
            try:
                self.on_connected()
            except Exception:
                logger.exception("ZooKeeper on_connected callback failed")
            monitor = asyncio.get_running_loop().create_task(self._monitor(conn), name="asynclock-zookeeper-ping")
            try:
                await self._read_loop(conn)
            except asyncio.CancelledError:
                monitor.cancel()
                if self._closing or self._closed:
                    self._drop(conn, "connection closed")
                # else cancelled from outside (its loop shutting down): the connection stays
                # up, so that the client's close then can still delete its nodes and end the session
                raise
            monitor.cancel()
            self._drop(conn, "connection closed")
            with contextlib.suppress(asyncio.CancelledError):
                await monitor

    async def _open(self, host: str, port: int, budget: float) -> Conn | None:
        """One attempt: ask ``host`` for this session (or a new one), take its answer, send the credentials."""
        request = protocol.ConnectRequest(
            protocol_version=0,
            last_seen_zxid=self.last_zxid,
            timeout=max(1, round(self.requested_timeout * 1000)),
            session_id=self.session_id,
            password=self._password,
            read_only=False,
        )
        shake = await handshake(host, port, budget, request)
        answer, writer, sent = shake.answer, shake.writer, shake.sent
        if answer.session_id == 0 or answer.timeout <= 0:
            writer.close()
            if self.session_id:
                self._expire("the server reports the session expired")
                return await self._open(host, port, budget)  # a new session on the same server
            return None
        if self.session_id and answer.session_id != self.session_id:  # pragma: no cover - not seen in practice
            self._expire("the server gave a different session")
        if not self.session_id:
            self.session_id = int(answer.session_id)
            self._password = bytes(answer.password)
            self.confirmed_at = sent
        else:
            self.reconnects += 1
            self.confirmed_at = max(self.confirmed_at, sent)
        self.timeout = answer.timeout / 1000
        for scheme, credentials in self._auth:
            # Answered in order, before any request of ours: the server
            # applies the credentials to everything sent after them.
            auth = protocol.AuthRequest(type=0, scheme=scheme, auth=credentials).serialize(AUTH_XID)
            writer.write(FRAME_SIZE.pack(len(auth)) + auth)
        self._conn_seq += 1
        now = asyncio.get_running_loop().time()
        logger.debug("ZooKeeper session %#x on %s:%d, timeout %.3fs", self.session_id, host, port, self.timeout)
        return Conn(self._conn_seq, shake.reader, writer, f"{host}:{port}", last_recv=now, last_send=now)

    def _expire(self, reason: str) -> None:
        old = self.session_id
        self.session_id = 0
        self._password = b"\x00" * 16
        self.confirmed_at = 0.0
        # (INFO: each lock held under it says it is lost, and why, at WARNING)
        logger.info("ZooKeeper session %#x expired: %s", old, reason)
        if old:
            try:
                self.on_expired(old)
            except Exception:
                logger.exception("ZooKeeper on_expired callback failed")

    async def _read_loop(self, conn: Conn) -> None:
        """Until ``conn`` ends: its frames are handled as they arrive (``Frames``)."""
        loop = asyncio.get_running_loop()

        def on_frame(frame: bytes) -> None:
            conn.last_recv = loop.time()
            self._dispatch(conn, frame)

        frames = Frames.attach(conn.reader, conn.writer, conn.host, on_frame)
        # (shielded: a cancellation of this task, the loop shutting down, must not end the reading)
        self._drop(conn, await asyncio.shield(frames.ended))

    def _dispatch(self, conn: Conn, frame: bytes) -> None:
        """Handle one reply frame: what it proves of the session first, then whatever waits on it."""
        reply = take(conn, frame)
        if reply.zxid > 0:
            self.last_zxid = max(self.last_zxid, reply.zxid)
        confirmed = reply.confirms
        if confirmed is not None:
            self.confirmed_at = max(self.confirmed_at, confirmed)
        expired = settle(conn, reply)
        if expired is not None:
            self._expire(expired)
            if reply.pending is not None:  # answered SessionExpired: this connection serves no session
                self._drop(conn, "session expired")

    async def _monitor(self, conn: Conn) -> None:
        """Ping while idle (if wanted) and give up a connection that stopped answering."""
        loop = asyncio.get_running_loop()
        while not conn.dead:
            period = self.timeout / 3
            await asyncio.sleep(max(0.01, period / 4))
            now = loop.time()
            if self.keepalive() and now - conn.last_send >= period:
                self._write_ping(conn, None)
            silent = conn.unanswered_for(now)
            if silent > max(period, 0.05):
                self._drop(conn, f"{conn.host} did not answer for {silent:.3f}s")
                return

    def _drop(self, conn: Conn, reason: str) -> None:
        """Tear ``conn`` down: fail its requests in flight, fire every watch with "disconnected"."""
        if conn.dead:
            return
        logger.debug("ZooKeeper connection %s dropped: %s", conn.host, reason)
        if self._conn is conn:
            self._conn = None
            if not self._closed:
                self._connected.clear()
                try:
                    self.on_disconnected(reason)
                except Exception:
                    logger.exception("ZooKeeper on_disconnected callback failed")
        conn.close(reason)
