"""Sharded pub/sub for Redis Cluster: one connection per node that serves a wanted channel.

Releases are announced with SPUBLISH on the lock's shard channel, and
waiters listen with SSUBSCRIBE on the node that serves that channel's slot
(Redis 7 or later). When a slot moves or a node fails, the server ends those
subscriptions (or the connection drops); the listener then asks the cluster
where the slot lives now, subscribes there, and wakes every local waiter
once it is back, because a release may have gone by unseen meanwhile.

A Cluster client's hand-overs of elections come on shard channels too, one
per election in whose line one of its candidates waits
(:class:`ShardHandovers`).

Besides the locks' release channels (``subscribe(name)``: a message wakes
the waiters of that lock), a listener routes any shard channel to callbacks
(``route``, as ``_pubsub.PubSub`` does on one server): an election's
announcements and a client's hand-overs of an election, whose ``on_resync``
is called after each gap in that channel's subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

try:
    from redis import exceptions as redis_errors
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.connection import Connection as RedisConnection
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis Cluster backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._errors import BackendUnavailable, ConfigurationError, plain
from ..._timing import RETRY_FIRST
from ...abc import BackendHooks
from .._background import Background
from ._connection import Connection
from ._listen import Subscribed
from ._pubsub import (
    DEFAULT_TTL,
    RECONNECT_MAX,
    SUBSCRIBE_TIMEOUT,
    OnMessage,
    OnResync,
    health_interval,
    listening_connection,
)
from ._queue import Tickets

__all__ = ["UNAVAILABLE", "ShardHandovers", "ShardListener"]

logger = logging.getLogger("asynclock")

#: Errors of the cluster client that mean "not reachable right now", not "bad request".
UNAVAILABLE = (
    redis_errors.RedisClusterException,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)


class ShardListener:
    """Sharded pub/sub: one connection per node that serves a wanted channel.

    Each connection is checked like the single-Redis listener's (a dead one is
    replaced within ttl/3 of the shortest lock ttl it serves), and stops on a
    refusal no retry can fix; the next subscribe tries again and raises it.
    """

    def __init__(self, connection: Connection, hooks: BackendHooks, channel_of: Callable[[str], str]) -> None:
        self.connection = connection
        self._cluster = cast(RedisCluster, connection.client)
        self._hooks = hooks
        self.ttl = DEFAULT_TTL
        self._channel_of = channel_of
        self._names: dict[bytes, str] = {}  # wanted channel -> lock name
        self._routes: dict[bytes, tuple[OnMessage, OnResync]] = {}  # wanted channel -> its callbacks
        self._shards: dict[str, Shard] = {}  # node name -> its connection
        self._refreshing: asyncio.Task[None] | None = None
        self.moves = 0  # channels the server dropped or we moved to another node (tests)

    def note_ttl(self, ttl: float) -> None:
        """A lock of ``ttl`` seconds relies on these connections: check them often enough for that ttl."""
        self.ttl = min(self.ttl, ttl)

    def node_for(self, channel: bytes) -> ClusterNode:
        """The primary that serves ``channel``'s slot, as the client's slot map says."""
        node = self._cluster.get_node_from_key(channel.decode())
        if node is None:
            raise redis_errors.SlotNotCoveredError(f"no node serves {channel!r}")
        return node

    def _shard(self, node: ClusterNode) -> Shard:
        shard = self._shards.get(node.name)
        if shard is None:
            shard = self._shards[node.name] = Shard(self, node)
        return shard

    async def subscribe(self, name: str) -> None:
        """Wake the waiters of the lock ``name`` on each release announced on its channel."""
        channel = self._channel_of(name).encode()
        self._names[channel] = name
        await self._place(channel)

    async def unsubscribe(self, name: str) -> None:
        channel = self._channel_of(name).encode()
        self._names.pop(channel, None)
        for shard in self._shards.values():
            if channel in shard.channels:
                await shard.unsubscribe(channel)

    async def route(
        self, channel: str, on_message: OnMessage, on_resync: OnResync, *, wait_connect: bool = True
    ) -> None:
        """Deliver every message of the shard channel ``channel`` to ``on_message`` until
        ``forget``, and call ``on_resync`` after each gap in its subscription.

        Returns once the slot's node confirmed the subscription, or (bounded)
        it did not in time: then ``on_resync`` is called once it is
        subscribed. Raises ConfigurationError if the cluster refuses the
        client for good. (``wait_connect``: always, as a Cluster's connections
        are made per node on demand.)
        """
        key = channel.encode()
        self._routes[key] = (on_message, on_resync)
        # A fresh client knows no slot yet; a route is asked for before the
        # request it must precede (a lock waiter's subscription follows one).
        with contextlib.suppress(BackendUnavailable), self.connection.edge:
            await self._cluster.initialize()  # (not reachable yet: placed after a refresh)
        await self._place(key)

    def forget(self, channel: str) -> None:
        """Stop delivering ``channel``'s messages, without I/O: the node's connection stays
        subscribed (until it is made again) and drops them."""
        key = channel.encode()
        self._routes.pop(key, None)
        if key not in self._names:
            for shard in self._shards.values():
                shard.channels.discard(key)

    async def _place(self, channel: bytes) -> None:
        try:
            node = self.node_for(channel)
        except UNAVAILABLE as exc:
            logger.info("no node for %r yet, subscribing after a refresh: %s", channel, self.connection.describe(exc))
            self.reroute()
            return
        shard = self._shard(node)
        await shard.subscribe(channel)
        failure = shard.failure
        if failure is not None:
            raise ConfigurationError(str(failure)) from failure.__cause__

    def message(self, channel: bytes, payload: bytes) -> None:
        route = self._routes.get(channel)
        if route is not None:
            route[0](payload)
            return
        name = self._names.get(channel)
        if name is not None:
            self._hooks.wake_one(name)

    def resubscribed(self, channel: bytes) -> None:
        """``channel`` is subscribed again after a gap: what went by meanwhile was not heard."""
        route = self._routes.get(channel)
        if route is not None:
            route[1]()
        else:
            self._hooks.wake_all()

    def wake_all(self) -> None:
        """Anything may have been missed: every waiter and every route looks again."""
        self._hooks.wake_all()
        for _, on_resync in list(self._routes.values()):
            on_resync()

    def reroute(self) -> None:
        """A shard lost channels (slot moved, node gone): find their nodes again."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._reroute(), name="asynclock-cluster-reroute")

    async def _reroute(self) -> None:
        delay = 0.05
        said: str | None = None  # why the last attempt failed, as logged
        while True:
            try:
                await self._cluster.nodes_manager.initialize()
                placed = True
                for channel in [*self._names, *self._routes]:
                    node = self.node_for(channel)
                    owner = self._shard(node)
                    for shard in self._shards.values():
                        if shard is not owner and channel in shard.channels:
                            shard.channels.discard(channel)
                            self.moves += 1
                    if channel not in owner.channels:
                        confirmed = await owner.subscribe(channel)
                        placed = placed and confirmed
                if placed:
                    # a release may have passed while the channel was not subscribed anywhere
                    self.wake_all()
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: try again later
                if isinstance(exc, ConfigurationError) or isinstance(self.connection.error(exc), ConfigurationError):
                    # (raised to the waiters that need it: not logged as well)
                    logger.debug("redis cluster pub/sub refused, not retrying: %s", self.connection.describe(exc))
                    self.wake_all()
                    return
                why = self.connection.describe(exc)
                level = logging.DEBUG if why == said else logging.INFO
                logger.log(level, "redis cluster pub/sub: cannot place channels yet: %s", why)
                said = why
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
        await asyncio.gather(*(shard.aclose() for shard in self._shards.values()))
        self._shards.clear()


class Shard:
    """One node's SSUBSCRIBE connection: reconnects, and hands moved channels back."""

    def __init__(self, owner: ShardListener, node: ClusterNode) -> None:
        self._owner = owner
        self._node = node
        self.channels: set[bytes] = set()
        self._pending: dict[bytes, list[asyncio.Future[bool]]] = {}
        self._leaving: set[bytes] = set()  # channels we unsubscribe ourselves
        self._conn: Any = None
        self._listener: Subscribed | None = None
        self._connected = asyncio.Event()
        self._settled = asyncio.Event()  # the current connection attempt succeeded or failed
        self._task: asyncio.Task[None] | None = None
        self._resubscribing: set[bytes] = set()
        #: Why this connection stopped: a refusal no retry can fix (None while it runs).
        self.failure: ConfigurationError | None = None

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self.failure = None
            self._settled.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-cluster-pubsub")

    async def subscribe(self, channel: bytes) -> bool:
        """Subscribe here; True once the node confirmed, False if it did not (rerouted later)."""
        self.channels.add(channel)
        self._leaving.discard(channel)
        self._ensure_task()
        if not self._connected.is_set():
            # Wait (briefly) for the connection attempt under way, so that a
            # refusal no retry can fix reaches the caller (see ``failure``).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                    await self._settled.wait()
        listener = self._listener
        if listener is None or not self._connected.is_set():
            return False  # subscribed (and waiters woken) once connected
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(future)
        try:
            listener.send(b"SSUBSCRIBE", channel)
        except (redis_errors.RedisError, OSError) as exc:
            logger.debug("SSUBSCRIBE failed, the shard will reconnect: %s", plain(exc))
            return False
        try:
            # A stalled node must not stall the waiter: it is bounded by the
            # holder's lease anyway, and the late confirmation still counts.
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                return await future
        except TimeoutError:
            return False

    async def unsubscribe(self, channel: bytes) -> None:
        self.channels.discard(channel)
        listener = self._listener
        if listener is not None and self._connected.is_set():
            self._leaving.add(channel)
            with contextlib.suppress(redis_errors.RedisError, OSError):
                listener.send(b"SUNSUBSCRIBE", channel)

    async def _run(self) -> None:
        delay = RETRY_FIRST
        owner = self._owner
        said: str | None = None  # why the last attempt failed, as logged: the same again is not news
        while True:
            conn = None
            try:
                conn = listening_connection(RedisConnection, self._node.connection_kwargs)
                # The handshake has no read timeout of its own: bounded here.
                async with asyncio.timeout(owner.connection.connect_timeout + health_interval(owner.ttl)):
                    await conn.connect()
                listener = Subscribed.attach(conn, self._handle)
                self._conn, self._listener = conn, listener
                self._connected.set()
                self._settled.set()
                # channels (re)subscribed here after a gap: wake everyone once confirmed
                self._resubscribing = set(self.channels)
                if self.channels:
                    listener.send(b"SSUBSCRIBE", *self.channels)
                await listener.watch(lambda: health_interval(owner.ttl))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect (the node may be gone)
                error = owner.connection.error(exc)
                if isinstance(error, ConfigurationError):
                    error.__cause__ = exc
                    self.failure = error
                    logger.debug("redis cluster pub/sub connection refused, not retrying: %s", error)
                else:
                    why = owner.connection.describe(exc)
                    level = logging.DEBUG if why == said else logging.INFO
                    logger.log(level, "redis cluster pub/sub connection to %s lost: %s", self._node.name, why)
                    said = why
            finally:
                self._connected.clear()
                self._settled.set()
                if self._listener is not None and self._listener.replies:
                    delay = RETRY_FIRST  # the node answered: the next connection starts from the shortest pause
                    said = None
                self._conn = self._listener = None
                self._settle(False)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()
            if self.failure is not None:
                owner.wake_all()  # each waiter tries again, and meets the refusal itself
                return
            if self.channels:
                owner.reroute()  # the slot may live elsewhere now
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    def _settle(self, value: bool, channel: bytes | None = None) -> None:
        targets = [channel] if channel is not None else list(self._pending)
        for key in targets:
            futures = self._pending.pop(key, []) if channel is None else self._pending.get(key, [])
            while futures:
                future = futures.pop(0)
                if not future.done():
                    future.set_result(value)
                if channel is not None:
                    break

    def _handle(self, message: Any) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return
        kind, channel = message[0], message[1]
        if kind == b"smessage":
            self._owner.message(channel, message[2])
        elif kind == b"ssubscribe":
            self._settle(True, channel)
            if channel in self._resubscribing:
                self._resubscribing.discard(channel)
                self._owner.resubscribed(channel)
        elif kind == b"sunsubscribe":
            if channel in self._leaving:
                self._leaving.discard(channel)
            elif channel in self.channels:
                # the server dropped it: its slot moved to another node
                self.channels.discard(channel)
                self._owner.moves += 1
                self._owner.reroute()
        elif isinstance(kind, bytes) and kind.startswith(b"-"):
            self._owner.reroute()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class _Listening:
    """This client's hand-over channel of one election: the holds in its line, and the subscription."""

    __slots__ = ("holds", "task")

    def __init__(self) -> None:
        self.holds: set[str] = set()
        self.task: asyncio.Task[None] | None = None


class ShardHandovers(Tickets):
    """This client's hand-over channels on a Cluster: per election, a shard channel in its slot
    (``channel_of(name)``), subscribed while one of this client's candidates waits in its line."""

    def __init__(self, connection: Connection, channel_of: Callable[[str], str]) -> None:
        super().__init__()
        #: The backend's shard listener: None before it starts and once it is closed.
        self.shards: ShardListener | None = None
        self._connection = connection
        self._channel_of = channel_of
        self._listening: dict[str, _Listening] = {}
        self._routing = Background()

    @property
    def listening(self) -> list[str]:
        """The elections whose hand-over channel this client subscribes, or is subscribing (for tests)."""
        return list(self._listening)

    async def listen(self, name: str, hold: str) -> None:
        """``hold`` may be handed the election ``name``: its hand-over channel is subscribed
        (once for all this client's holds in that line; a failed subscription is tried again).

        Raises BackendUnavailable if the backend is closed, and the
        subscription's error (ConfigurationError for a refusal) otherwise;
        ``hold`` is not registered then.
        """
        try:
            await self._subscribe(name, hold)
        except BaseException:
            self.done(name, hold)  # (no request was made for it)
            raise

    async def _subscribe(self, name: str, hold: str) -> None:
        listening = self._listening.get(name)
        if listening is None:
            listening = self._listening[name] = _Listening()
        listening.holds.add(hold)
        task = listening.task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            shards = self.shards
            if shards is None:  # closed meanwhile (or never started)
                raise BackendUnavailable("the Redis Cluster backend is closed")
            # (its error reaches each hold that awaits it; the registry retrieves it if none is left to)
            task = listening.task = self._routing.spawn(shards.route(self._channel_of(name), self.handle, self.resync))
            task.set_name("asynclock-cluster-route")
        with self._connection.edge:
            await asyncio.shield(task)

    def done(self, name: str, hold: str) -> None:
        """``hold`` waits in the line of ``name`` no more; the last one of this client's there
        ends the subscription to its hand-over channel (no I/O: the connection drops its messages)."""
        self.forget(hold)
        listening = self._listening.get(name)
        if listening is None:
            return
        listening.holds.discard(hold)
        if not listening.holds:
            del self._listening[name]
            if listening.task is not None and not listening.task.done():
                listening.task.cancel()
            if self.shards is not None:
                self.shards.forget(self._channel_of(name))

    def raise_failure(self) -> None:
        """Nothing to raise here: a refused subscription reaches the hold in :meth:`listen`."""

    async def aclose(self) -> None:
        """End every subscription task (the shard listener, closed next, closes its connections)."""
        self._routing.cancel()
        await self._routing.aclose(0)
        self._listening.clear()
