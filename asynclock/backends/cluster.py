"""Redis Cluster (``redis+cluster://h1:p1,h2:p2,…`` or a ``redis.asyncio.RedisCluster``).

The single-Redis backend's keys and scripts, on a cluster client: every key
of one lock (hash, fence counter, release channel) carries the ``{name}``
hash tag, so each script touches one slot and the cluster client routes it
(following MOVED and ASK when a slot migrates). Two things differ:

* Renewals are grouped by slot: one script call per slot in use, sent to
  the slots' nodes in parallel (a script may not touch keys of two slots).
* Releases are announced with SPUBLISH on the lock's shard channel, and
  waiters listen with SSUBSCRIBE on the node that serves that channel's slot
  (sharded pub/sub, Redis 7 or later). When a slot moves or a node fails, the
  server ends those subscriptions (or the connection drops); the listener
  then asks the cluster where the slot lives now, subscribes there, and
  wakes every local waiter once it is back, because a release may have gone
  by unseen meanwhile.

A hold lives on the primary that serves its slot. Cluster failover has the
same hole as Sentinel: a replica promoted before it received the acquire does
not have the key; the holder learns it at its next renewal (loss, never a
silent continuation), but another client may have taken the lock by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    from redis import exceptions as redis_errors
    from redis._parsers import AsyncCommandsParser
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.connection import Connection
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis Cluster backend needs redis-py: pip install 'asynclock[redis]'") from exc

from .._errors import BackendUnavailable, ConfigurationError, LockError
from .._legacy import LOCK, Shape
from .._legacy import LegacyBackend as Backend
from .._legacy import legacy_unsupported as unsupported
from .._options import DEFAULT_CONNECT_TIMEOUT, mask_text, mask_url
from .._values import LockInfo
from ..abc import Acquired, BackendHooks, Busy, RenewItem
from . import _redis_scripts as scripts
from .redis import (
    DEFAULT_TTL,
    RedisBackend,
    _unreachable,
    accepted,
    check_options,
    database,
    health_interval,
    next_message,
    url_value,
)

__all__ = ["ClusterBackend"]

logger = logging.getLogger("asynclock")

T = TypeVar("T")


#: Longest wait for a node to confirm a shard subscription, in seconds.
SUBSCRIBE_TIMEOUT = 1.0

#: Errors of the cluster client that mean "not reachable right now", not "bad request".
_UNAVAILABLE = (
    redis_errors.RedisClusterException,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)


#: Options of redis-py's RedisCluster that the URL (or asynclock) sets itself.
_FROM_URL = ("host", "port", "startup_nodes", "path")


def cluster_options() -> dict[str, Any]:
    """What ``redis.asyncio.RedisCluster`` takes, keyword or URL parameter (the nodes come from the URL)."""
    found = accepted(RedisCluster)
    for ours in _FROM_URL:
        found.pop(ours, None)
    return found


class _AnyPrimaryParser(AsyncCommandsParser):
    """Reads the command table from any primary that answers.

    redis-py asks only the first primary it knows for COMMAND while it maps
    the cluster; when that node is down, every request fails, even those for
    slots that live primaries serve.
    """

    __slots__ = ("_cluster",)

    def __init__(self, cluster: RedisCluster) -> None:
        super().__init__()
        self._cluster = cluster

    async def initialize(self, node: ClusterNode | None = None) -> None:
        first = node if node is not None else getattr(self, "node", None)
        candidates = [first, *(primary for primary in self._cluster.get_primaries() if primary is not first)]
        failure: BaseException | None = None
        for candidate in candidates:
            if candidate is None:
                continue
            try:
                await super().initialize(candidate)
                return
            except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
                failure = exc
        raise failure or redis_errors.ConnectionError("no primary answered COMMAND")


class ClusterBackend(RedisBackend):
    """Locks on a Redis Cluster.

    Example::

        async with asynclock.connect("redis+cluster://n1:7000,n2:7001,n3:7002") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    kind = "redis+cluster"

    def __init__(
        self,
        client: RedisCluster,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        nodes = ",".join(node.name for node in client.startup_nodes)
        super().__init__(
            client,  # type: ignore[arg-type]
            prefix=prefix,
            owns_client=owns_client,
            connect_timeout=connect_timeout,
            where=f"Redis Cluster at {nodes}",
        )
        self._secrets.append(client.nodes_manager.connection_kwargs.get("password"))
        self._cluster = client
        self._release = client.register_script(scripts.RELEASE_SHARDED)
        self._shards: _ShardListener | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> ClusterBackend:
        """``redis+cluster://[:password@]h1:p1,h2:p2,…[?option=…]``: any reachable nodes of the cluster.

        Query parameters and ``options`` go to ``redis.asyncio.RedisCluster``;
        one it does not take raises ValueError (naming the closest valid one)
        before any I/O.
        """
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        nodes: list[ClusterNode] = []
        for host in hosts.split(","):
            name, _, port = host.strip().rpartition(":")
            if not name or not port.isdigit():
                raise ValueError(f"a Redis Cluster URL names its nodes as host:port, got {host!r} in {mask_url(url)}")
            nodes.append(ClusterNode(name, int(port)))
        if database(parts.path, url):
            raise ValueError(f"Redis Cluster has only database 0, got {mask_url(url)}")
        valid = cluster_options()
        check_options(url, options, valid, "redis+cluster://")
        kwargs: dict[str, Any] = {
            key: url_value(key, value, valid.get(key)) for key, value in parse_qsl(parts.query, keep_blank_values=True)
        }
        if userinfo:
            user, _, password = userinfo.partition(":")
            if user:
                kwargs["username"] = unquote(user)
            if password:
                kwargs["password"] = unquote(password)
        kwargs.update(options)
        kwargs.setdefault("socket_connect_timeout", connect_timeout)
        # Fail fast on a dead node (the front retries requests itself): a
        # client that retries with backoff holds its topology refresh, and so
        # every other slot's requests, for a second per failed request.
        kwargs.setdefault("retry", Retry(NoBackoff(), 1))
        try:
            client = RedisCluster(startup_nodes=nodes, **kwargs)
        except redis_errors.RedisClusterException as exc:  # a bad option (no I/O yet)
            raise ValueError(mask_text(str(exc), [kwargs.get("password")])) from None
        client.commands_parser = _AnyPrimaryParser(client)
        return cls(client, prefix=prefix, owns_client=True, connect_timeout=connect_timeout)

    @classmethod
    def from_client(
        cls,
        client: RedisCluster,  # type: ignore[override]
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> ClusterBackend:
        """A backend on a cluster client the caller made (and closes); it takes no options."""
        check_options("", options, (), "a redis.asyncio.RedisCluster client")
        return cls(client, prefix=prefix, owns_client=False, connect_timeout=connect_timeout)

    def error(self, exc: BaseException) -> BaseException:
        """Also the cluster client's own errors (some not RedisError) as ours."""
        translated = super().error(exc)
        if isinstance(translated, (BackendUnavailable, ConfigurationError)) or not isinstance(exc, _UNAVAILABLE):
            return translated
        # no node reachable yet, or the cluster settling (CLUSTERDOWN, TRYAGAIN)
        cause = _unreachable(exc, self._connect_timeout)
        error = BackendUnavailable(mask_text(f"{self.where} is not available: {cause or repr(exc)}", self._secrets))
        if cause is not None:
            error.connect_timeout = self._connect_timeout
        return error

    async def _guard(self, awaitable: Awaitable[T]) -> T:
        """Cluster client errors that the single-Redis code does not catch (not RedisError) as ours."""
        try:
            return await awaitable
        except LockError as exc:
            cause = exc.__cause__
            if isinstance(exc, (BackendUnavailable, ConfigurationError)) or not isinstance(cause, _UNAVAILABLE):
                raise
            raise self.error(cause) from cause
        except _UNAVAILABLE as exc:
            raise self.error(exc) from exc

    def primitive(self, shape: Shape) -> Backend:
        """Only the plain lock: the other shapes hand over on a per-client channel, which a shard cannot route."""
        if shape == LOCK:
            return self
        raise unsupported(
            self.kind,
            shape,
            "use a single Redis server (redis://) or Sentinel (redis+sentinel://) for the fair lock, "
            "read-write lock and semaphore",
        )

    @property
    def cluster(self) -> RedisCluster:
        return self._cluster

    @property
    def shards(self) -> _ShardListener | None:
        """The sharded pub/sub listener (for tests)."""
        return self._shards

    async def start(self, hooks: BackendHooks) -> None:
        self._shards = _ShardListener(self, hooks, self.channel)

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        if self._shards is not None:
            self._shards.note_ttl(ttl)
        return await self._guard(super().try_acquire(name, hold, ttl))

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        return await self._guard(super().set_count(name, hold, count, ttl))

    async def release(self, name: str, hold: str) -> bool:
        return await self._guard(super().release(name, hold))

    async def info(self, name: str) -> LockInfo:
        return await self._guard(super().info(name))

    async def names(self) -> list[str]:
        return await self._guard(super().names())

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One script call per slot, all slots in parallel, each bounded on its own."""
        groups: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(self._cluster.keyslot(self.lock_key(item.name)), []).append(index)

        async def renew_slot(indexes: list[int]) -> list[bool | BaseException]:
            group = [items[i] for i in indexes]
            try:
                # A slot whose node is gone must not hold up the other slots'
                # answers past their leases: each group gets a quarter of its
                # shortest ttl (renewals start a third into the lease).
                async with asyncio.timeout(min(item.ttl for item in group) / 4):
                    return await RedisBackend.renew(self, group)
            except (*_UNAVAILABLE, TimeoutError) as exc:
                return [self.error(exc)] * len(indexes)

        answers = await asyncio.gather(*(renew_slot(indexes) for indexes in groups.values()))
        results: list[bool | BaseException] = [False] * len(items)
        for indexes, answer in zip(groups.values(), answers, strict=True):
            for index, result in zip(indexes, answer, strict=True):
                results[index] = result
        return results

    async def subscribe(self, name: str) -> None:
        if self._shards is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the Redis Cluster backend is closed")
        await self._shards.subscribe(name)

    async def unsubscribe(self, name: str) -> None:
        if self._shards is not None:
            await self._shards.unsubscribe(name)

    async def aclose(self) -> None:
        if self._shards is not None:
            await self._shards.aclose()
            self._shards = None
        await super().aclose()


class _ShardListener:
    """Sharded pub/sub: one connection per node that serves a wanted channel.

    Each connection is checked like the single-Redis listener's (a dead one is
    replaced within ttl/3 of the shortest lock ttl it serves), and stops on a
    refusal no retry can fix; the next subscribe tries again and raises it.
    """

    def __init__(self, backend: ClusterBackend, hooks: BackendHooks, channel_of: Any) -> None:
        self.backend = backend
        self._cluster = backend.cluster
        self._hooks = hooks
        self.ttl = DEFAULT_TTL
        self._channel_of = channel_of
        self._names: dict[bytes, str] = {}  # wanted channel -> lock name
        self._shards: dict[str, _Shard] = {}  # node name -> its connection
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

    def _shard(self, node: ClusterNode) -> _Shard:
        shard = self._shards.get(node.name)
        if shard is None:
            shard = self._shards[node.name] = _Shard(self, node)
        return shard

    async def subscribe(self, name: str) -> None:
        channel = self._channel_of(name).encode()
        self._names[channel] = name
        try:
            node = self.node_for(channel)
        except _UNAVAILABLE as exc:
            logger.info("no node for %r yet, will subscribe after a refresh: %r", name, exc)
            self.reroute()
            return
        shard = self._shard(node)
        await shard.subscribe(channel)
        failure = shard.failure
        if failure is not None:
            raise ConfigurationError(str(failure)) from failure.__cause__

    async def unsubscribe(self, name: str) -> None:
        channel = self._channel_of(name).encode()
        self._names.pop(channel, None)
        for shard in self._shards.values():
            if channel in shard.channels:
                await shard.unsubscribe(channel)

    def message(self, channel: bytes) -> None:
        name = self._names.get(channel)
        if name is not None:
            self._hooks.wake_one(name)

    def wake_all(self) -> None:
        self._hooks.wake_all()

    def reroute(self) -> None:
        """A shard lost channels (slot moved, node gone): find their nodes again."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._reroute(), name="asynclock-cluster-reroute")

    async def _reroute(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._cluster.nodes_manager.initialize()
                placed = True
                for channel in list(self._names):
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
                    self._hooks.wake_all()
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: try again later
                if isinstance(exc, ConfigurationError) or isinstance(self.backend.error(exc), ConfigurationError):
                    logger.warning("redis cluster pub/sub refused, not retrying: %s", self.backend.describe(exc))
                    self._hooks.wake_all()
                    return
                logger.info("redis cluster pub/sub: cannot place channels yet: %s", self.backend.describe(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
        await asyncio.gather(*(shard.aclose() for shard in self._shards.values()))
        self._shards.clear()


class _Shard:
    """One node's SSUBSCRIBE connection: reconnects, and hands moved channels back."""

    def __init__(self, owner: _ShardListener, node: ClusterNode) -> None:
        self._owner = owner
        self._node = node
        self.channels: set[bytes] = set()
        self._pending: dict[bytes, list[asyncio.Future[bool]]] = {}
        self._leaving: set[bytes] = set()  # channels we unsubscribe ourselves
        self._conn: Any = None
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
        conn = self._conn
        if conn is None or not self._connected.is_set():
            return False  # subscribed (and waiters woken) once connected
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(future)
        try:
            await conn.send_command("SSUBSCRIBE", channel)
        except (redis_errors.RedisError, OSError) as exc:
            logger.debug("SSUBSCRIBE failed, the shard will reconnect: %r", exc)
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
        conn = self._conn
        if conn is not None and self._connected.is_set():
            self._leaving.add(channel)
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await conn.send_command("SUNSUBSCRIBE", channel)

    async def _run(self) -> None:
        delay = 0.02
        owner = self._owner
        while True:
            conn = None
            try:
                kwargs = {
                    key: value
                    for key, value in self._node.connection_kwargs.items()
                    if key != "retry" and not key.startswith(("maint_notifications", "orig_"))
                }
                kwargs.update(socket_timeout=None, decode_responses=False, protocol=2)
                conn = Connection(**kwargs)
                # The handshake has no read timeout of its own: bounded here.
                async with asyncio.timeout(owner.backend._connect_timeout + health_interval(owner.ttl)):
                    await conn.connect()  # type: ignore[no-untyped-call]
                self._conn = conn
                self._connected.set()
                self._settled.set()
                # channels (re)subscribed here after a gap: wake everyone once confirmed
                self._resubscribing = set(self.channels)
                if self.channels:
                    await conn.send_command("SSUBSCRIBE", *self.channels)
                while True:
                    message = await next_message(conn, health_interval(owner.ttl))
                    delay = 0.02
                    self._handle(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect (the node may be gone)
                error = owner.backend.error(exc)
                if isinstance(error, ConfigurationError):
                    error.__cause__ = exc
                    self.failure = error
                    logger.warning("redis cluster pub/sub connection refused, not retrying: %s", error)
                else:
                    logger.info(
                        "redis cluster pub/sub connection to %s lost: %s", self._node.name, owner.backend.describe(exc)
                    )
            finally:
                self._connected.clear()
                self._settled.set()
                self._conn = None
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
            delay = min(delay * 2, 2.0)

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
            self._owner.message(channel)
        elif kind == b"ssubscribe":
            self._settle(True, channel)
            if channel in self._resubscribing:
                self._resubscribing.discard(channel)
                self._owner.wake_all()
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
