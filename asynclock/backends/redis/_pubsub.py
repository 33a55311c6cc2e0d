"""A client's pub/sub connection to one Redis server, shared by all its listeners.

Whoever listens on a channel gives two callbacks (:meth:`PubSub.route`): one
for each message, one for "messages may have been missed" (the channel was
subscribed again after a reconnect, or the connection was refused for good).
The connection is our own, not one of redis-py's pool: it has no read
timeout (it waits for messages), and redis-py retries nothing behind our back.
redis-py makes it; from then on it is read by ``_listen.Subscribed``, which
hands each message over as it arrives.

A connection that dies without a FIN (a dropped NAT entry, a paused proxy)
looks idle for ever; it is pinged once idle for ttl/6 of the shortest lock
ttl it serves, so a dead one is replaced within ttl/3.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

try:
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._errors import ConfigurationError
from ..._timing import RETRY_FIRST
from ._connection import Connection
from ._listen import Subscribed

__all__ = ["DEFAULT_TTL", "SUBSCRIBE_TIMEOUT", "PubSub", "health_interval", "listening_connection"]

logger = logging.getLogger("asynclock")

#: Longest wait for the server to confirm a SUBSCRIBE, in seconds.
SUBSCRIBE_TIMEOUT = 1.0
#: The lock ttl a pub/sub connection's health check assumes before any request names one.
DEFAULT_TTL = 30.0
#: Longest pause between reconnects of a pub/sub connection, in seconds.
RECONNECT_MAX = 2.0

#: What a listener does with one message's payload, and when messages may have been missed.
OnMessage = Callable[[bytes], None]
OnResync = Callable[[], None]


def health_interval(ttl: float) -> float:
    """How long a pub/sub connection may be idle before it is checked: a dead one is noticed within ttl/3."""
    return max(ttl / 6, 0.01)


def listening_connection(connection_class: type, kwargs: dict[str, Any]) -> Any:
    """A plain RESP2 connection with the settings ``kwargs`` (of a pool or a node): no
    read timeout (it waits for messages), no retries or maintenance handling behind our back."""
    settings = {
        key: value
        for key, value in kwargs.items()
        if key != "retry" and not key.startswith(("maint_notifications", "orig_"))
    }
    settings.update(socket_timeout=None, decode_responses=False, protocol=2)
    return cast(Any, connection_class)(**settings)


class PubSub:
    """The client's one pub/sub connection to a server, shared by every listener.

    It owns its reconnects: after any connection error it reconnects with
    backoff, subscribes every routed channel again and, once the server
    confirms each, calls that channel's ``on_resync``. A refusal that no retry
    can fix (credentials, ACL, TLS certificate) stops it: the error is kept in
    ``failure``, every ``on_resync`` is called so that waiters see it, and the
    next ``route`` tries once more (and raises it if it is refused again).
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._routes: dict[bytes, tuple[OnMessage, OnResync]] = {}
        self._pending: dict[bytes, list[asyncio.Future[None]]] = {}
        self._conn: Any = None
        self._listener: Subscribed | None = None
        self._connected = asyncio.Event()
        self._settled = asyncio.Event()  # the current connection attempt succeeded or failed
        self._task: asyncio.Task[None] | None = None
        self._reconnects = 0
        self._ttl = DEFAULT_TTL
        #: Why the connection stopped: a refusal no retry can fix (None while it runs).
        self.failure: ConfigurationError | None = None

    @property
    def reconnects(self) -> int:
        """How many times the connection was made again after it was lost."""
        return self._reconnects

    def note_ttl(self, ttl: float) -> None:
        """A lock of ``ttl`` seconds relies on this connection: check it often enough for that ttl."""
        if ttl < self._ttl:
            self._ttl = ttl

    def raise_failure(self) -> None:
        """Raise the refusal that stopped the connection, if one did."""
        failure = self.failure
        if failure is not None:
            raise ConfigurationError(str(failure)) from failure.__cause__

    async def route(
        self, channel: str, on_message: OnMessage, on_resync: OnResync, *, wait_connect: bool = False
    ) -> None:
        """Deliver every message of ``channel`` to ``on_message`` until ``unroute``.

        Returns once the server confirmed the subscription, or (bounded) it
        did not in time: then the channel is subscribed, and ``on_resync``
        called, once connected. ``wait_connect``: also wait (as briefly) for
        a connection attempt under way, so that a refusal no retry can fix
        reaches the caller as ConfigurationError.
        """
        key = channel.encode()
        self._routes[key] = (on_message, on_resync)
        self._ensure_task()
        if wait_connect and not self._connected.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                    await self._settled.wait()
            self.raise_failure()
        listener = self._listener
        if listener is None or not self._connected.is_set():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append(future)
        try:
            listener.send(b"SUBSCRIBE", key)
        except (redis_errors.RedisError, OSError) as exc:
            logger.debug("SUBSCRIBE failed, the listener will reconnect: %s", self._connection.describe(exc))
            return
        # A connection that stopped answering must not hold the caller for
        # ever: the health check replaces the connection, and the late
        # confirmation still resolves this future.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                await asyncio.shield(future)
        self.raise_failure()

    async def unroute(self, channel: str) -> None:
        """Stop delivering ``channel``'s messages (and unsubscribe it)."""
        key = channel.encode()
        self._routes.pop(key, None)
        listener = self._listener
        if listener is not None and self._connected.is_set():
            with contextlib.suppress(redis_errors.RedisError, OSError):
                listener.send(b"UNSUBSCRIBE", key)

    def forget(self, channel: str) -> None:
        """Stop delivering ``channel``'s messages, without I/O: the connection stays subscribed
        (until it is made again) and drops them."""
        self._routes.pop(channel.encode(), None)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self.failure = None
            self._settled.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-redis-pubsub")

    async def _run(self) -> None:
        delay = RETRY_FIRST
        client: Any = self._connection.client
        said: str | None = None  # why the last attempt failed, as logged: the same again is not news
        while True:
            conn = None
            try:
                pool = client.connection_pool
                conn = listening_connection(pool.connection_class, pool.connection_kwargs)
                # The handshake has no read timeout of its own: bounded here.
                async with asyncio.timeout(self._connection.connect_timeout + health_interval(self._ttl)):
                    await conn.connect()
                wanted = list(self._routes)
                # Routes that arrived while disconnected were not confirmed:
                # each is told to resync once the server confirms it again.
                resubscribing = set(wanted)
                listener = Subscribed.attach(conn, functools.partial(self._handle, resubscribing=resubscribing))
                self._conn, self._listener = conn, listener
                self._connected.set()
                self._settled.set()
                if wanted:
                    listener.send(b"SUBSCRIBE", *wanted)
                await listener.watch(lambda: health_interval(self._ttl))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                error = self._connection.error(exc)
                if isinstance(error, ConfigurationError):
                    error.__cause__ = exc
                    self.failure = error
                    # (raised to every waiter that needs this connection: not logged as well)
                    logger.debug("redis pub/sub connection refused, not retrying: %s", error)
                else:
                    why = self._connection.describe(exc)
                    level = logging.DEBUG if why == said else logging.INFO
                    logger.log(level, "redis pub/sub connection lost, reconnecting: %s", why)
                    said = why
            finally:
                self._connected.clear()
                self._settled.set()
                if self._listener is not None and self._listener.replies:
                    delay = RETRY_FIRST  # the server answered: the next connection starts from the shortest pause
                    said = None
                self._conn = self._listener = None
                for futures in self._pending.values():
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
                self._pending.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()
            if self.failure is not None:
                # No retry can fix it: every listener is told, and its waiters see the failure.
                for _, on_resync in list(self._routes.values()):
                    on_resync()
                return
            self._reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    def _handle(self, message: Any, resubscribing: set[bytes]) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return
        kind, channel = message[0], message[1]
        if kind == b"message":
            route = self._routes.get(channel)
            if route is not None:
                route[0](message[2])
        elif kind == b"subscribe":
            futures = self._pending.get(channel)
            if futures:
                future = futures.pop(0)
                if not future.done():
                    future.set_result(None)
            if channel in resubscribing:
                resubscribing.discard(channel)
                route = self._routes.get(channel)
                if route is not None:
                    route[1]()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
