"""One Redis server (``redis://``, ``rediss://``, ``unix://``, or a given client).

The hold is a hash with a PEXPIRE ttl (see ``_redis_scripts`` for the
layout and the scripts). Waiting is woken by one pub/sub connection per
client, opened by this module and shared by every lock of the client; a
waiter also never sleeps past the holder's remaining PTTL, because a key
that simply expires sends no message.

A try that finds the lock taken registers its client in the lock's waiting
set; a release wakes the first live client of that set alone, on the
client's own channel, and that client wakes one of its waiters. The woken
client has a short turn (``TURN_MS``) in which other clients' tries are
refused, so the releaser cannot take the lock straight back. A client whose
waiters have all left by then passes the wake-up on (``LEAVE``), so one
release costs one try, however many clients wait.

The fair lock, the read-write lock and the semaphore are adapters
(``_redis_primitives``): a server-side queue whose release script hands the
lock to the head waiter, announced on a channel of that waiter's client
alone, which the same pub/sub connection listens to (``_Listener.route``).
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
from .._values import LockInfo
from ..abc import LOCK, Acquired, Backend, BackendHooks, Busy, RenewItem, Shape, unsupported
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
#: How long a client woken by a release has the lock to itself, in ms (see _redis_scripts).
TURN_MS = 100
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
    queues_waiters = False

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        _check_replicas(replicas, replica_timeout)
        self._client = client
        self._owns_client = owns_client
        self._prefix = prefix
        #: Replicas that must confirm each acquire and renewal (Redis WAIT); 0: do not wait.
        self.replicas = replicas
        self._replica_timeout_ms = _ms(replica_timeout)
        # Until start(), and for subclasses that listen otherwise (Cluster) or
        # nodes that are never started (Redlock's): releases are announced on
        # the lock's channel to every subscriber.
        self._acquire = client.register_script(scripts.ACQUIRE)
        self._release = client.register_script(scripts.RELEASE)
        # Once started: a release wakes one waiting client on its own channel.
        self._wake_one_client = False
        self._acquire_register = client.register_script(scripts.ACQUIRE_REGISTER)
        self._release_wake = client.register_script(scripts.RELEASE_WAKE)
        self._leave = client.register_script(scripts.LEAVE)
        self._set_count = client.register_script(scripts.SET_COUNT)
        self._renew = client.register_script(scripts.RENEW_MANY)
        self._info = client.register_script(scripts.INFO)
        self._listener: _Listener | None = None
        self._handovers: Handovers | None = None
        #: The channel on which a release wakes this client (see _redis_scripts).
        self.wake_channel = f"{prefix}:wake:{secrets.token_hex(8)}"
        self._wake_route: asyncio.Task[None] | None = None
        self._waiting: set[str] = set()  # names this client's waiters wait for (subscribe .. unsubscribe)
        # Per waited-for name: wake-ups received, and the most of them that a
        # try sent after them has answered (a wake-up not answered by a try
        # when the last waiter leaves is passed on).
        self._wakes: dict[str, int] = {}
        self._answered: dict[str, int] = {}
        self._registered: set[str] = set()  # names whose waiting set may list this client
        # Per waited-for name: the loop time by which every local waiter will
        # have tried again (the latest "retry after" handed out).
        self._retry_by: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "asynclock", **options: Any) -> RedisBackend:
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
        client = aioredis.Redis.from_url(url, **options)
        return cls(client, prefix=prefix, owns_client=True, replicas=replicas, replica_timeout=replica_timeout)

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    # -- keys -----------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        return f"{self._prefix}:{{{name}}}"

    def primitive(self, shape: Shape) -> Backend:
        """The plain lock is the backend; the fair lock, read-write lock and semaphore are adapters."""
        if shape == LOCK:
            return self
        if self.replicas:
            raise unsupported(
                self.kind,
                shape,
                "not with replicas= (a hand-over is not confirmed by the replicas): connect without it",
            )
        from ._redis_primitives import RedisQueued

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

    def waiting_key(self, name: str) -> str:
        """The sorted set of the clients waiting for ``name``."""
        return f"{self._prefix}:{{{name}}}:waiting"

    def _turn_key(self, name: str) -> str:
        return f"{self._prefix}:{{{name}}}:turn"

    def _others_wait(self, name: str) -> bool:
        """Whether this client has waiters for ``name`` besides the one trying now."""
        listener = self._listener
        waiting = getattr(listener._hooks, "waiting", None) if listener is not None else None
        if not callable(waiting):
            return True  # unknown: stay registered (a spare wake-up is passed on)
        return int(waiting(name)) > 1

    def _acquire_request(self, name: str, hold: str, ttl: float) -> tuple[Any, list[str], list[Any], bool | None]:
        """The acquire script, its keys and arguments, and whether it asks to stay registered.

        Only a client that waits for ``name`` (subscribed) registers: a first
        try, or a try-lock, leaves the waiting set alone (None).
        """
        if not self._wake_one_client:
            keys = [self.lock_key(name), self._fence_key(name)]
            return self._acquire, keys, [hold, _ms(ttl), FENCE_LIFETIME_MS], None
        keys = [self.lock_key(name), self._fence_key(name), self.waiting_key(name), self._turn_key(name)]
        if name not in self._waiting:
            return self._acquire_register, keys, [hold, _ms(ttl), FENCE_LIFETIME_MS, self.wake_channel, -1], None
        others = self._others_wait(name)
        stay_ms = 0
        if others:
            # Listed until the other waiters' next tries, which refresh the entry.
            ahead = self._retry_by.get(name, 0.0) - asyncio.get_running_loop().time()
            stay_ms = _ms(max(ttl, ahead) + ttl)
        args = [hold, _ms(ttl), FENCE_LIFETIME_MS, self.wake_channel, stay_ms]
        return self._acquire_register, keys, args, others

    async def _release_hold(self, name: str, hold: str) -> bool:
        if not self._wake_one_client:
            done = await _call(self._release(keys=[self.lock_key(name), self.channel(name)], args=[hold]))
        else:
            done = await _call(
                self._release_wake(
                    keys=[self.lock_key(name), self.waiting_key(name), self._turn_key(name)], args=[name, TURN_MS, hold]
                )
            )
        return bool(done)

    # -- protocol ----------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        # No I/O here: like redis-py, the first request connects, and the
        # front retries requests that fail to reach the server.
        self._listener = _Listener(self._client, hooks, self.channel)
        self._wake_one_client = True

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        script, keys, args, stay = self._acquire_request(name, hold, ttl)
        seen = self._wakes.get(name, 0)  # wake-ups this try answers for
        if self.replicas:
            (got, value), confirmed = await self._script_then_wait(script, keys, args)
            self._answer(name, seen, stay if got == 1 else (True if stay is not None else None))
            if got == 1 and confirmed < self.replicas:
                # Not on enough replicas: a failover now could lose it. Roll it
                # back; the front retries (with a new try) until its deadline.
                await self._release_hold(name, hold)
                raise BackendUnavailable(
                    f"only {confirmed} of {self.replicas} replicas confirmed the acquire within the replica timeout"
                )
        else:
            got, value = await _call(script(keys=keys, args=args))
            self._answer(name, seen, stay if got == 1 else (True if stay is not None else None))
        if got == 1:
            return Acquired(int(value))
        pttl = int(value)
        if name in self._waiting:
            by = asyncio.get_running_loop().time() + max(pttl, 0) / 1000
            self._retry_by[name] = max(self._retry_by.get(name, 0.0), by)
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
                # Load every script of the plain lock at once: the next calls
                # (the release, the registering tries) find theirs loaded.
                scripts_of = {script, self._acquire, self._release, self._acquire_register, self._release_wake}
                try:
                    async with self._client.pipeline(transaction=False) as pipe:
                        for each in scripts_of:
                            pipe.script_load(each.script)
                        await pipe.execute()
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
                if self.replicas:
                    answer, confirmed = await self._script_then_wait(self._renew, keys, args)
                    if confirmed < self.replicas:
                        # Renewed on the primary only: not trusted; retried until the deadline.
                        error = BackendUnavailable(
                            f"only {confirmed} of {self.replicas} replicas confirmed the renewal"
                        )
                        results += [error if flag else False for flag in answer]
                        continue
                else:
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
        """Make sure this client's wake-up channel is listened to (once per client, not per name)."""
        listener = self._listener
        if listener is None:  # closed (or not started): no notifications to wait for
            raise BackendUnavailable("the Redis backend is closed")
        self._waiting.add(name)
        route = self._wake_route
        if route is None or (route.done() and (route.cancelled() or route.exception() is not None)):
            route = self._wake_route = asyncio.get_running_loop().create_task(
                listener.route(self.wake_channel, self._on_wake, self._on_resync), name="asynclock-redis-wake"
            )
        await asyncio.shield(route)

    async def unsubscribe(self, name: str) -> None:
        """The last local waiter of ``name`` left: leave its waiting set, passing on an unused wake-up."""
        self._waiting.discard(name)
        unused = self._wakes.pop(name, 0) > self._answered.pop(name, 0)
        registered = name in self._registered
        self._registered.discard(name)
        self._retry_by.pop(name, None)
        if (unused or registered) and self._listener is not None:
            await self._leave_waiting(name, unused)
            listener = self._listener
            if name in self._waiting and listener is not None:
                # A new waiter came meanwhile; its registration may have landed
                # before our removal: have it try (and so register) again.
                listener._hooks.wake_one(name)

    def _answer(self, name: str, seen: int, stay: bool | None) -> None:
        """A try sent after ``seen`` wake-ups of ``name`` was answered: they did their job.

        ``stay``: whether the waiting set lists this client now (None: untouched).
        """
        if seen and name in self._wakes and self._answered.get(name, 0) < seen:
            self._answered[name] = seen
        if stay:
            self._registered.add(name)
        elif stay is not None:
            self._registered.discard(name)

    def _on_wake(self, payload: bytes) -> None:
        name = payload.decode("utf-8", "replace")
        listener = self._listener
        if listener is not None and name in self._waiting:
            self._wakes[name] = self._wakes.get(name, 0) + 1
            listener._hooks.wake_one(name)
            return
        # Nobody here waits for it any more: wake the next client.
        task = asyncio.get_running_loop().create_task(self._leave_waiting(name, True), name="asynclock-redis-pass-on")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_resync(self) -> None:
        # The wake-up channel was subscribed again: wake-ups may have gone by unseen.
        listener = self._listener
        if listener is not None:
            listener._hooks.wake_all()

    async def _leave_waiting(self, name: str, pass_on: bool) -> None:
        keys = [self.lock_key(name), self.waiting_key(name), self._turn_key(name)]
        try:
            await _call(self._leave(keys=keys, args=[name, TURN_MS, self.wake_channel, "1" if pass_on else "0"]))
        except (LockError, OSError) as exc:
            # The others are still bounded by the lock's remaining lease.
            logger.info("could not pass a wake-up for %r on: %r", name, exc)

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
        """Names of the locks currently held under this client's prefix."""
        found = []
        start = len(self._prefix) + 2
        try:
            async for key in self._client.scan_iter(match=f"{self._prefix}:{{*}}", count=1000):
                text = _text(key) or ""
                if text.endswith("}") and not text.endswith(":fence") and not text.endswith(":released"):
                    found.append(text[start:-1])
        except (redis_errors.RedisError, OSError) as exc:
            raise _translate(exc) from exc
        return found

    async def aclose(self) -> None:
        pending = list(self._tasks)
        if self._wake_route is not None:
            pending.append(self._wake_route)
            self._wake_route = None
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
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
