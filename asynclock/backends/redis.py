"""One Redis server (``redis://``, ``rediss://``, ``unix://``, or a given client).

The plain lock is a FIFO queue whose release hands the lock over to the head
waiter inside the release script: the fair lock's resource
(``_redis_primitives``, family ``fair``), so ``lock(name)`` and
``lock(name, fair=True)`` are one lock, as on ZooKeeper and PostgreSQL. A
hand-over is announced on a channel of the waiter's client alone, which one
pub/sub connection per client listens to (``_Listener.route``); with
``replicas=N`` the new holder confirms it with a request of its own and
``WAIT`` before trusting it.

This class also keeps the lock as a hash with a PEXPIRE ttl (see
``_redis_scripts``), whose releases are announced on the lock's channel to
every subscriber: Redis Cluster (a script cannot publish to a per-client
channel in another slot) and Redlock's nodes use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from .._errors import BackendUnavailable, LockError
from .._legacy import LOCK, Shape
from .._legacy import LegacyBackend as Backend
from .._legacy import legacy_unsupported as unsupported
from .._options import DEFAULT_CONNECT_TIMEOUT
from .._values import LockInfo
from ..abc import Acquired, BackendHooks, Busy, RenewItem
from . import _redis_scripts as scripts

if TYPE_CHECKING:
    from ._redis_primitives import Handovers

__all__ = ["RedisBackend"]

logger = logging.getLogger("asynclock")

T = TypeVar("T")

#: How long the fence counter outlives the last acquisition, in ms (see _redis_scripts).
FENCE_LIFETIME_MS = 24 * 3600 * 1000
#: Leases renewed by one script call.
RENEW_CHUNK = 1000
#: Longest wait for the server to confirm a SUBSCRIBE, in seconds.
SUBSCRIBE_TIMEOUT = 1.0


def _ms(seconds: float) -> int:
    """Seconds to a PEXPIRE argument: never 0 or negative (that would delete the key)."""
    return max(1, math.ceil(seconds * 1000))


def _check_replicas(replicas: object, replica_timeout: object) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be a whole number >= 0, got {replicas!r}")
    if (
        isinstance(replica_timeout, bool)
        or not isinstance(replica_timeout, (int, float))
        or not 0 < replica_timeout < float("inf")
    ):
        raise ValueError(f"replica_timeout must be a positive number of seconds, got {replica_timeout!r}")


def _pop_query(url: str, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Take our own options out of a URL's query string."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {key: value for key, value in query if key in names}
    rest = [(key, value) for key, value in query if key not in names]
    return urlunsplit(parts._replace(query=urlencode(rest))), own


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _is_readonly(exc: BaseException) -> bool:
    """A READONLY reply: a replica, or a primary demoted by a failover.

    redis-py turns it into ReadOnlyError (with the code stripped from the
    message); a bare ResponseError keeps the "READONLY" prefix.
    """
    return isinstance(exc, redis_errors.ReadOnlyError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("READONLY")
    )


def _translate(exc: BaseException) -> BaseException:
    """Map redis-py errors onto ours; the original becomes ``__cause__``."""
    if _is_readonly(exc):
        return BackendUnavailable(f"Redis answered READONLY (a replica or demoted primary): {exc}")
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, TimeoutError)):
        return BackendUnavailable(f"Redis did not answer: {exc!r}")
    if isinstance(exc, redis_errors.BusyLoadingError):
        return BackendUnavailable(f"Redis is loading its data: {exc}")
    if isinstance(exc, redis_errors.RedisError):
        return LockError(f"Redis error: {exc}")
    return exc


async def _call(awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except (redis_errors.RedisError, OSError) as exc:
        raise _translate(exc) from exc


class RedisBackend:
    """Locks on one Redis server (or a primary with replicas)."""

    kind = "redis"
    queues_waiters = False  # (its own hash-layout lock; the plain lock is ``primitive(LOCK)``)

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        replicas: int = 0,
        replica_timeout: float = 0.5,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        _check_replicas(replicas, replica_timeout)
        self._client = client
        self._connect_timeout = connect_timeout
        self._owns_client = owns_client
        self._prefix = prefix
        #: Replicas that must confirm each acquire and renewal (Redis WAIT); 0: do not wait.
        self.replicas = replicas
        self._replica_timeout_ms = _ms(replica_timeout)
        # The hash-layout lock (Cluster, Redlock's nodes): releases are
        # announced on the lock's channel to every subscriber.
        self._acquire = client.register_script(scripts.ACQUIRE)
        self._release = client.register_script(scripts.RELEASE)
        self._set_count = client.register_script(scripts.SET_COUNT)
        self._renew = client.register_script(scripts.RENEW_MANY)
        self._info = client.register_script(scripts.INFO)
        self._listener: _Listener | None = None
        self._handovers: Handovers | None = None
        self._plain: Backend | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> RedisBackend:
        """A backend with its own client for ``url`` (closed by ``aclose``).

        ``replicas`` and ``replica_timeout`` may come as keyword arguments or
        URL query parameters; everything else goes to ``redis.asyncio.Redis.from_url``.
        """
        url, own = _pop_query(url, ("replicas", "replica_timeout"))
        replicas: Any = options.pop("replicas", own.get("replicas", 0))
        replica_timeout: Any = options.pop("replica_timeout", own.get("replica_timeout", 0.5))
        try:  # URL query values are text
            replicas = int(replicas) if isinstance(replicas, str) else replicas
            replica_timeout = float(replica_timeout) if isinstance(replica_timeout, str) else replica_timeout
        except ValueError as exc:
            raise ValueError(f"bad replicas/replica_timeout option in the URL: {exc}") from None
        _check_replicas(replicas, replica_timeout)  # before a client exists
        options.setdefault("socket_connect_timeout", connect_timeout)
        client = aioredis.Redis.from_url(url, **options)
        return cls(
            client,
            prefix=prefix,
            owns_client=True,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
        )

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    # -- keys -----------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        return f"{self._prefix}:{{{name}}}"

    def primitive(self, shape: Shape) -> Backend:
        """Every shape is an adapter: a queued resource (``_redis_primitives``).

        The plain lock is the fair lock's resource. With ``replicas=`` the
        read-write lock and the semaphore are refused (their hand-overs are
        not confirmed by the replicas yet); the plain and fair lock confirm theirs.
        """
        from ._redis_primitives import RedisQueued

        if shape == LOCK or shape.kind == "fair":
            if self._plain is None:
                self._plain = RedisQueued(self, Shape("fair"))
            return self._plain
        if self.replicas:
            raise unsupported(
                self.kind,
                shape,
                "not with replicas= (its hand-overs are not confirmed by the replicas): connect without it",
            )
        return RedisQueued(self, shape)

    def shape_key(self, name: str, family: str) -> str:
        """The base key of the primitive ``family`` ("fair", "rw", "sem") of ``name``."""
        return f"{self._prefix}:{{{name}}}:{family}"

    def handovers(self) -> Handovers:
        """The channel on which the server hands this client fair locks, read/write holds and permits."""
        if self._handovers is None:
            from ._redis_primitives import Handovers

            self._handovers = Handovers(f"{self._prefix}:handover:{secrets.token_hex(8)}")
        return self._handovers

    def _fence_key(self, name: str) -> str:
        return f"{self._prefix}:{{{name}}}:fence"

    def channel(self, name: str) -> str:
        """Where releases of ``name`` are announced to every subscriber (Cluster, Redlock's nodes)."""
        return f"{self._prefix}:{{{name}}}:released"

    async def _release_hold(self, name: str, hold: str) -> bool:
        done = await _call(self._release(keys=[self.lock_key(name), self.channel(name)], args=[hold]))
        return bool(done)

    # -- protocol ----------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        # No I/O here: like redis-py, the first request connects, and the
        # front retries requests that fail to reach the server.
        self._listener = _Listener(self._client, hooks, self.channel)

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        """The hash-layout try (Cluster, Redlock's nodes; the front uses ``primitive(LOCK)``)."""
        keys = [self.lock_key(name), self._fence_key(name)]
        got, value = await _call(self._acquire(keys=keys, args=[hold, _ms(ttl), FENCE_LIFETIME_MS]))
        if got == 1:
            return Acquired(int(value))
        pttl = int(value)
        return Busy(pttl / 1000 if pttl >= 0 else 0.0)

    async def _script_then_wait(self, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, int]:
        """Run ``script`` and WAIT for the replicas on the same connection, in one round trip."""
        for attempt in (1, 2):
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.execute_command("WAIT", self.replicas, self._replica_timeout_ms)
                    answer, confirmed = await pipe.execute(raise_on_error=False)
            except (redis_errors.RedisError, OSError) as exc:
                raise _translate(exc) from exc
            if isinstance(answer, redis_errors.NoScriptError) and attempt == 1:
                try:
                    await self._client.script_load(script.script)
                except (redis_errors.RedisError, OSError) as exc:
                    raise _translate(exc) from exc
                continue
            if isinstance(answer, BaseException):
                raise _translate(answer) from answer
            if isinstance(confirmed, BaseException):
                raise _translate(confirmed) from confirmed
            return answer, int(confirmed)
        raise AssertionError("unreachable")

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        raise NotImplementedError("Redis uses try_acquire and release notifications")

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        done = await _call(self._set_count(keys=[self.lock_key(name)], args=[hold, count, _ms(ttl)]))
        return bool(done)

    async def release(self, name: str, hold: str) -> bool:
        return await self._release_hold(name, hold)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        results: list[bool | BaseException] = []
        for start in range(0, len(items), RENEW_CHUNK):
            chunk = items[start : start + RENEW_CHUNK]
            keys = [self.lock_key(item.name) for item in chunk]
            args: list[str | int] = []
            for item in chunk:
                args += [item.hold, _ms(item.ttl)]
            try:
                answer = await self._renew(keys=keys, args=args)
            except BackendUnavailable as exc:
                cause = exc.__cause__
                if cause is not None and _is_readonly(cause):
                    results += [False] * len(chunk)
                else:
                    results += [exc] * len(chunk)
                continue
            except redis_errors.ResponseError as exc:
                if _is_readonly(exc):
                    # A demoted primary: whatever it holds is not the lock any more.
                    results += [False] * len(chunk)
                    continue
                results += [_translate(exc)] * len(chunk)
                continue
            except (redis_errors.RedisError, OSError) as exc:
                results += [_translate(exc)] * len(chunk)
                continue
            results += [bool(flag) for flag in answer]
        return results

    async def subscribe(self, name: str) -> None:
        """Listen for releases of ``name`` (the hash-layout lock's channel)."""
        if self._listener is None:  # closed (or not started): no notifications to wait for
            raise BackendUnavailable("the Redis backend is closed")
        await self._listener.subscribe(name)

    async def unsubscribe(self, name: str) -> None:
        if self._listener is not None:
            await self._listener.unsubscribe(name)

    async def info(self, name: str) -> LockInfo:
        owner, count, token, pttl = await _call(self._info(keys=[self.lock_key(name)]))
        holder = _text(owner)
        return LockInfo(
            name=name,
            key=self.lock_key(name),
            owner=holder,
            hold_count=int(count) if holder is not None and count is not None else 0,
            ttl=int(pttl) / 1000 if holder is not None and int(pttl) >= 0 else None,
            waiters=None,
            token=int(token) if holder is not None and token is not None else None,
        )

    async def names(self) -> list[str]:
        """Names of the locks currently held under this client's prefix.

        The plain (and fair) lock's holds ZSET ``<prefix>:{<name>}:fair``, and
        the hash ``<prefix>:{<name>}`` of the hash-layout lock (Cluster, Redlock).
        """
        found = []
        start = len(self._prefix) + 2
        try:
            async for key in self._client.scan_iter(match=f"{self._prefix}:{{*}}*", count=1000):
                text = _text(key) or ""
                if text.endswith("}"):
                    found.append(text[start:-1])
                elif text.endswith("}:fair"):
                    found.append(text[start : -len("}:fair")])
        except (redis_errors.RedisError, OSError) as exc:
            raise _translate(exc) from exc
        return found

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
            self._listener = None
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self._client.aclose()


class _Listener:
    """The client's one pub/sub connection, shared by all its locks.

    It owns its reconnects: after any connection error it reconnects with
    backoff, subscribes every wanted channel again and, once the server
    confirms, wakes every local waiter (a release may have been missed).
    """

    def __init__(self, client: aioredis.Redis, hooks: BackendHooks, channel_of: Callable[[str], str]) -> None:
        self._client = client
        self._hooks = hooks
        self._channel_of = channel_of
        self._names: dict[bytes, str] = {}  # wanted channel -> lock name
        # channels of other consumers: channel -> (on message payload, on resubscribed after a reconnect)
        self._routes: dict[bytes, tuple[Callable[[bytes], None], Callable[[], None]]] = {}
        self._pending: dict[bytes, list[asyncio.Future[None]]] = {}
        self._conn: Any = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reconnects = 0

    @property
    def reconnects(self) -> int:
        return self._reconnects

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-redis-pubsub")

    async def route(self, channel: str, on_message: Callable[[bytes], None], on_resync: Callable[[], None]) -> None:
        """Deliver every message of ``channel`` to ``on_message``, for the client's lifetime.

        ``on_resync`` is called whenever the channel is subscribed again after a
        reconnect (messages may have been missed meanwhile).
        """
        key = channel.encode()
        self._routes[key] = (on_message, on_resync)
        await self._subscribe_channel(key)

    async def subscribe(self, name: str) -> None:
        channel = self._channel_of(name).encode()
        self._names[channel] = name
        await self._subscribe_channel(channel)

    async def _subscribe_channel(self, channel: bytes) -> None:
        self._ensure_task()
        conn = self._conn
        if conn is None or not self._connected.is_set():
            return  # the listener subscribes it (and wakes waiters) once connected
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(future)
        try:
            await conn.send_command("SUBSCRIBE", channel)
        except (redis_errors.RedisError, OSError) as exc:
            logger.debug("SUBSCRIBE failed, the listener will reconnect: %r", exc)
            return
        # A connection that stopped answering (no read timeout on it) must not
        # hold the waiter for ever: it is bounded by the holder's lease anyway,
        # and the late confirmation still resolves this future.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                await asyncio.shield(future)

    async def unsubscribe(self, name: str) -> None:
        channel = self._channel_of(name).encode()
        self._names.pop(channel, None)
        conn = self._conn
        if conn is not None and self._connected.is_set():
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await conn.send_command("UNSUBSCRIBE", channel)

    def kill_connection(self) -> None:
        """Drop the pub/sub connection (tests: the listener must recover)."""
        conn = self._conn
        if conn is not None and getattr(conn, "_writer", None) is not None:
            conn._writer.transport.abort()

    async def _run(self) -> None:
        delay = 0.02
        while True:
            conn = None
            try:
                # A plain RESP2 connection of our own: no read timeout (it waits
                # for messages), no retries or maintenance handling behind our back.
                kwargs = {
                    key: value
                    for key, value in self._client.connection_pool.connection_kwargs.items()
                    if key != "retry" and not key.startswith(("maint_notifications", "orig_"))
                }
                kwargs.update(socket_timeout=None, decode_responses=False, protocol=2)
                conn = cast(Any, self._client.connection_pool.connection_class)(**kwargs)
                await conn.connect()
                self._conn = conn
                self._connected.set()
                wanted = list(self._names) + list(self._routes)
                # Waiters that arrived while disconnected were not confirmed:
                # wake everyone once the server confirms each channel again.
                resubscribing = set(wanted)
                if wanted:
                    await conn.send_command("SUBSCRIBE", *wanted)
                while True:
                    message = await conn.read_response(timeout=math.inf)
                    delay = 0.02
                    self._handle(message, resubscribing)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                logger.info("redis pub/sub connection lost, reconnecting: %r", exc)
            finally:
                self._connected.clear()
                self._conn = None
                for futures in self._pending.values():
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
                self._pending.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()
            self._reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _handle(self, message: Any, resubscribing: set[bytes]) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return
        kind, channel = message[0], message[1]
        if kind == b"message":
            route = self._routes.get(channel)
            if route is not None:
                route[0](message[2])
                return
            name = self._names.get(channel)
            if name is not None:
                self._hooks.wake_one(name)
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
                name = self._names.get(channel)
                if name is not None:
                    self._hooks.wake_all()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
