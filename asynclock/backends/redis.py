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
import inspect
import logging
import math
import re
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from .._errors import BackendUnavailable, ConfigurationError, LockError
from .._legacy import LOCK, Shape
from .._legacy import LegacyBackend as Backend
from .._legacy import legacy_unsupported as unsupported
from .._options import DEFAULT_CONNECT_TIMEOUT, mask_text, mask_url, query_names, reject_unknown, take_query, whole
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
#: The lock ttl a pub/sub connection's health check assumes before any request names one.
DEFAULT_TTL = 30.0
#: What ``connect()`` itself reads from every URL and keyword (see ``asynclock.connect``).
CLIENT_OPTIONS = ("ttl", "prefix", "connect_timeout")
#: Query parameters and keyword options that the redis:// backend reads itself.
OWN_OPTIONS = ("replicas", "replica_timeout")


def _ms(seconds: float) -> int:
    """Seconds to a PEXPIRE argument: never 0 or negative (that would delete the key)."""
    return max(1, math.ceil(seconds * 1000))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# -- options ----------------------------------------------------------------------


def accepted(*targets: Callable[..., Any]) -> dict[str, Any]:
    """The keyword options the ``targets`` take, with their defaults, read from their signatures.

    A class contributes its ``__init__`` and, as long as that passes
    ``**kwargs`` on, its bases' (redis-py's connection classes do so).
    """
    found: dict[str, Any] = {}
    for target in targets:
        functions = (
            [klass.__dict__["__init__"] for klass in target.__mro__ if "__init__" in klass.__dict__]
            if isinstance(target, type)
            else [target]
        )
        for function in functions:
            params = inspect.signature(function).parameters.values()
            for param in params:
                named = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
                if named and param.name not in ("self", "cls"):
                    found.setdefault(param.name, param.default)
            if not any(param.kind == param.VAR_KEYWORD for param in params):
                break
    return found


def connection_options(connection_class: type) -> dict[str, Any]:
    """What ``redis.asyncio.Redis.from_url`` takes (keyword or URL parameter) for ``connection_class``."""
    found = accepted(aioredis.Redis.from_url, aioredis.ConnectionPool, connection_class)
    found.pop("url", None)
    return found


def check_options(
    url: str, options: Iterable[str], valid: Collection[str], where: str, *, taken: Collection[str] = ()
) -> None:
    """ValueError for an unknown query parameter of ``url`` or keyword in ``options``.

    ``taken``: names read from the URL before (``ttl``, …); they are valid too.
    """
    known = {*CLIENT_OPTIONS, *taken, *valid}
    reject_unknown(query_names(url), known, where)
    reject_unknown(options, {*known, "on_event"}, where)


def url_value(name: str, text: str, default: object = None) -> Any:
    """A URL parameter's text as the type redis-py wants (its own URL parsers, else the default's type)."""
    parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
    try:
        if parser is not None:
            return parser(text)
        if isinstance(default, bool):
            return text.strip().upper() not in ("0", "F", "FALSE", "N", "NO", "")
        if isinstance(default, (int, float)):
            return type(default)(text)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {name!r} in the URL: {text!r}") from None
    return text


def database(path: str, url: str) -> int | None:
    """The database number of a redis:// URL's path (None without one); ValueError if it is not a number."""
    text = unquote(path).strip("/")
    if not text:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(
            f"the database of a Redis URL is a number (redis://host:port/0), got {text!r} in {mask_url(url)}"
        )
    return int(text)


def _check_replicas(replicas: object, replica_timeout: object) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be a whole number >= 0, got {replicas!r}")
    if (
        isinstance(replica_timeout, bool)
        or not isinstance(replica_timeout, (int, float))
        or not 0 < replica_timeout < float("inf")
    ):
        raise ValueError(f"replica_timeout must be a positive number of seconds, got {replica_timeout!r}")


def _replica_options(options: dict[str, Any], own: dict[str, str]) -> tuple[Any, Any]:
    """``replicas`` and ``replica_timeout`` from keywords (popped) or URL text, checked."""
    replicas: Any = options.pop("replicas", own.get("replicas", 0))
    replica_timeout: Any = options.pop("replica_timeout", own.get("replica_timeout", 0.5))
    if isinstance(replicas, str):
        replicas = whole(replicas, "replicas")
    if isinstance(replica_timeout, str):
        try:
            replica_timeout = float(replica_timeout)
        except ValueError:
            raise ValueError(f"replica_timeout must be a number of seconds, got {replica_timeout!r}") from None
    _check_replicas(replicas, replica_timeout)
    return replicas, replica_timeout


# -- errors -------------------------------------------------------------------------


def address(kwargs: dict[str, Any]) -> str:
    """The server a redis-py connection's settings point at: ``host:port`` or the socket path."""
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def tag(exc: BaseException, where: str) -> None:
    """Let ``exc`` name the server it came from, when that is more precise than the backend's own name."""
    exc.asynclock_where = where  # type: ignore[attr-defined]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it (redis-py wraps socket and TLS errors, sometimes twice)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _refusal(exc: BaseException) -> str | None:
    """What the server refused if no retry can fix it (credentials, ACL, database, TLS), else None."""
    for error in _chain(exc):
        if isinstance(error, (redis_errors.AuthenticationError, redis_errors.AuthenticationWrongNumberOfArgsError)):
            return f"refused the credentials: {str(error)!r}"
        if isinstance(error, redis_errors.NoPermissionError):
            return f"refused permission (ACL): {str(error)!r}"
        if isinstance(error, redis_errors.ResponseError) and "DB index is out of range" in str(error):
            return f"has no such database: {str(error)!r}"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"presented a TLS certificate that was refused: {error.verify_message or error.reason or error}"
    return None


def _unreachable(exc: BaseException, connect_timeout: float | None) -> str | None:
    """Why no connection could be made at all (refused, name not resolved, …), or None if one was."""
    chain = list(_chain(exc))
    for error in chain:
        if isinstance(error, socket.gaierror):
            return "name not resolved"
        if isinstance(error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(error, FileNotFoundError):
            return "no socket at that path"
        if isinstance(error, redis_errors.TimeoutError) and "connecting" in str(error):
            return "timed out" + (f" after {float(connect_timeout)} s" if connect_timeout is not None else "")
    for error in chain:
        # redis-py's words for any other failed connect ("Error 113 connecting to …")
        if isinstance(error, redis_errors.ConnectionError) and " connecting to " in str(error):
            cause = error.__cause__ or error.__context__
            return cause.strerror.lower() if isinstance(cause, OSError) and cause.strerror else str(error)
    return None


def _is_readonly(exc: BaseException) -> bool:
    """A READONLY reply: a replica, or a primary demoted by a failover.

    redis-py turns it into ReadOnlyError (with the code stripped from the
    message); a bare ResponseError keeps the "READONLY" prefix.
    """
    return isinstance(exc, redis_errors.ReadOnlyError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("READONLY")
    )


def _translate(
    exc: BaseException,
    where: str = "Redis",
    *,
    connect_timeout: float | None = None,
    secrets: Iterable[str | None] = (),
) -> BaseException:
    """Map redis-py errors onto ours, naming ``where`` (the original becomes ``__cause__``).

    ``where`` names the server ("Redis at host:port"); ``secrets`` (passwords)
    are masked in every message.
    """
    # (a connection that knows better which server it talked to tags its errors)
    at = next((tag for error in _chain(exc) if (tag := getattr(error, "asynclock_where", None))), where)
    refused = _refusal(exc)
    if refused is not None:
        return ConfigurationError(mask_text(f"{at} {refused}", secrets))
    if _is_readonly(exc):
        return BackendUnavailable(mask_text(f"{at} answered READONLY (a replica or demoted primary): {exc}", secrets))
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, TimeoutError)):
        cause = _unreachable(exc, connect_timeout)
        if cause is not None:
            error = BackendUnavailable(mask_text(f"{at} could not be reached: {cause}", secrets))
            error.connect_timeout = connect_timeout
            return error
        if isinstance(exc, redis_errors.BusyLoadingError):
            return BackendUnavailable(mask_text(f"{at} is loading its data: {exc}", secrets))
        return BackendUnavailable(mask_text(f"{at} did not answer: {exc!r}", secrets))
    if isinstance(exc, redis_errors.RedisError):
        return LockError(mask_text(f"{at}: Redis error: {exc}", secrets))
    return exc


async def _call(awaitable: Awaitable[T], backend: RedisBackend | None = None) -> T:
    try:
        return await awaitable
    except (redis_errors.RedisError, OSError) as exc:
        raise (_translate(exc) if backend is None else backend.error(exc)) from exc


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
        where: str | None = None,
    ) -> None:
        _check_replicas(replicas, replica_timeout)
        self._client = client
        self._connect_timeout = connect_timeout
        settings = self._settings()
        #: The server as messages name it ("Redis at host:port"), never with a password.
        self.where = where if where is not None else f"Redis at {address(settings)}"
        # masked wherever redis-py's or the server's words are quoted
        self._secrets = [settings.get("password")]
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

    def _settings(self) -> dict[str, Any]:
        """The client's connection settings (host, port or path, password, …)."""
        pool = getattr(self._client, "connection_pool", None)
        return dict(getattr(pool, "connection_kwargs", {}))

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
        URL query parameters; everything else goes to
        ``redis.asyncio.Redis.from_url``, which takes each as either too.
        Raises ValueError for an option neither takes (naming the closest
        valid one) and for a database that is not a number, before any I/O.
        """
        rest, own = take_query(url, OWN_OPTIONS)
        parts = urlsplit(rest)
        connection_class = options.get("connection_class") or {
            "rediss": aioredis.SSLConnection,
            "unix": aioredis.UnixDomainSocketConnection,
        }.get(parts.scheme.lower(), aioredis.Connection)
        valid = {*connection_options(connection_class), *OWN_OPTIONS}
        check_options(rest, options, valid, f"{parts.scheme}://", taken=own)
        if parts.scheme.lower() in ("redis", "rediss"):
            database(parts.path, url)
        replicas, replica_timeout = _replica_options(options, own)
        options.setdefault("socket_connect_timeout", connect_timeout)
        try:
            client = aioredis.Redis.from_url(rest, **options)
        except (ValueError, TypeError) as exc:  # redis-py's word on a bad value, without the URL's password
            password = urlsplit(url).password
            raise type(exc)(mask_text(str(exc), [password, unquote(password or "")])) from None
        return cls(
            client,
            prefix=prefix,
            owns_client=True,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def from_client(
        cls,
        client: aioredis.Redis,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> RedisBackend:
        """A backend on a client the caller made (and closes): ``replicas`` and ``replica_timeout`` only."""
        check_options("", options, OWN_OPTIONS, "a redis.asyncio.Redis client")
        replicas, replica_timeout = _replica_options(options, {})
        return cls(
            client,
            prefix=prefix,
            owns_client=False,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
        )

    def error(self, exc: BaseException) -> BaseException:
        """``exc`` (from redis-py) as asynclock's error, naming this server, passwords masked."""
        return _translate(exc, self.where, connect_timeout=self._connect_timeout, secrets=self._secrets)

    def describe(self, exc: BaseException) -> str:
        """``exc`` for a log line: passwords masked."""
        return mask_text(repr(exc), self._secrets)

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
        done = await _call(self._release(keys=[self.lock_key(name), self.channel(name)], args=[hold]), self)
        return bool(done)

    # -- protocol ----------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        # No I/O here: like redis-py, the first request connects, and the
        # front retries requests that fail to reach the server.
        self._listener = _Listener(self, hooks, self.channel)

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        """The hash-layout try (Cluster, Redlock's nodes; the front uses ``primitive(LOCK)``)."""
        if self._listener is not None:
            self._listener.note_ttl(ttl)
        keys = [self.lock_key(name), self._fence_key(name)]
        got, value = await _call(self._acquire(keys=keys, args=[hold, _ms(ttl), FENCE_LIFETIME_MS]), self)
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
                raise self.error(exc) from exc
            if isinstance(answer, redis_errors.NoScriptError) and attempt == 1:
                try:
                    await self._client.script_load(script.script)
                except (redis_errors.RedisError, OSError) as exc:
                    raise self.error(exc) from exc
                continue
            if isinstance(answer, BaseException):
                raise self.error(answer) from answer
            if isinstance(confirmed, BaseException):
                raise self.error(confirmed) from confirmed
            return answer, int(confirmed)
        raise AssertionError("unreachable")

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        raise NotImplementedError("Redis uses try_acquire and release notifications")

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        done = await _call(self._set_count(keys=[self.lock_key(name)], args=[hold, count, _ms(ttl)]), self)
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
                results += [self.error(exc)] * len(chunk)
                continue
            except (redis_errors.RedisError, OSError) as exc:
                results += [self.error(exc)] * len(chunk)
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
        owner, count, token, pttl = await _call(self._info(keys=[self.lock_key(name)]), self)
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
            raise self.error(exc) from exc
        return found

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
            self._listener = None
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self._client.aclose()


async def next_message(conn: Any, interval: float) -> Any:
    """The next message on a subscribed connection, or ConnectionError if it went silent.

    A connection that dies without a FIN (a dropped NAT entry, a paused
    proxy) looks idle for ever: after ``interval`` seconds without a message
    a PING goes out, and no answer within another ``interval`` means the
    connection is dead (so it is noticed at most ``2 * interval`` after it died).
    """
    message = await conn.read_response(timeout=interval)
    if message is not None:
        return message
    async with asyncio.timeout(interval):
        await conn.send_command("PING")
    message = await conn.read_response(timeout=interval)
    if message is None:
        raise redis_errors.ConnectionError(f"no answer to a health check within {interval:.3g} s")
    return message


def health_interval(ttl: float) -> float:
    """How long a pub/sub connection may be idle before it is checked: a dead one is noticed within ttl/3."""
    return max(ttl / 6, 0.01)


class _Listener:
    """The client's one pub/sub connection, shared by all its locks.

    It owns its reconnects: after any connection error it reconnects with
    backoff, subscribes every wanted channel again and, once the server
    confirms, wakes every local waiter (a release may have been missed). An
    idle connection is checked every ttl/6 (``next_message``), so one that died
    silently is replaced within ttl/3 of the shortest lock ttl it serves.

    A refusal that no retry can fix (credentials, ACL, TLS certificate) stops
    it: the error is kept in ``failure``, every waiter is woken to see it, and
    the next subscribe tries once more (and raises it if it is refused again).
    """

    def __init__(self, backend: RedisBackend, hooks: BackendHooks, channel_of: Callable[[str], str]) -> None:
        self._backend = backend
        self._client = backend.client
        self._hooks = hooks
        self._channel_of = channel_of
        self._names: dict[bytes, str] = {}  # wanted channel -> lock name
        # channels of other consumers: channel -> (on message payload, on resubscribed after a reconnect)
        self._routes: dict[bytes, tuple[Callable[[bytes], None], Callable[[], None]]] = {}
        self._pending: dict[bytes, list[asyncio.Future[None]]] = {}
        self._conn: Any = None
        self._connected = asyncio.Event()
        self._settled = asyncio.Event()  # the current connection attempt succeeded or failed
        self._task: asyncio.Task[None] | None = None
        self._reconnects = 0
        self._ttl = DEFAULT_TTL
        #: Why the listener stopped: a refusal no retry can fix (None while it runs).
        self.failure: ConfigurationError | None = None

    @property
    def reconnects(self) -> int:
        return self._reconnects

    def note_ttl(self, ttl: float) -> None:
        """A lock of ``ttl`` seconds relies on this connection: check it often enough for that ttl."""
        self._ttl = min(self._ttl, ttl)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self.failure = None
            self._settled.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-redis-pubsub")

    def _raise_failure(self) -> None:
        failure = self.failure
        if failure is not None:
            raise ConfigurationError(str(failure)) from failure.__cause__

    async def route(self, channel: str, on_message: Callable[[bytes], None], on_resync: Callable[[], None]) -> None:
        """Deliver every message of ``channel`` to ``on_message``, for the client's lifetime.

        ``on_resync`` is called whenever the channel is subscribed again after a
        reconnect (messages may have been missed meanwhile), and when the
        listener stops on a refusal (``failure``). Raises ConfigurationError if
        the server refuses this connection or the subscription.
        """
        key = channel.encode()
        self._routes[key] = (on_message, on_resync)
        # Not waiting for a connection in the making: a waiter's lease time
        # counts from before this call (its refusal reaches it through on_resync).
        await self._subscribe_channel(key, connecting=False)

    async def subscribe(self, name: str) -> None:
        """Wake a local waiter of ``name`` on each release; raises ConfigurationError if refused."""
        channel = self._channel_of(name).encode()
        self._names[channel] = name
        await self._subscribe_channel(channel, connecting=True)

    async def _subscribe_channel(self, channel: bytes, *, connecting: bool) -> None:
        """Subscribe ``channel`` and wait (briefly) for the server's confirmation.

        ``connecting``: also wait (as briefly) for a connection attempt under
        way, so that a refusal no retry can fix reaches the caller. Otherwise,
        or if that takes longer, the listener subscribes the channel (and
        wakes waiters) once connected.
        """
        self._ensure_task()
        if connecting and not self._connected.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                    await self._settled.wait()
            self._raise_failure()
        conn = self._conn
        if conn is None or not self._connected.is_set():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(future)
        try:
            await conn.send_command("SUBSCRIBE", channel)
        except (redis_errors.RedisError, OSError) as exc:
            logger.debug("SUBSCRIBE failed, the listener will reconnect: %s", self._backend.describe(exc))
            return
        # A connection that stopped answering must not hold the waiter for
        # ever: it is bounded by the holder's lease anyway, the health check
        # replaces the connection, and the late confirmation still resolves this future.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                await asyncio.shield(future)
        self._raise_failure()

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

    def _connection(self) -> Any:
        """A plain RESP2 connection of our own: no read timeout (it waits for
        messages), no retries or maintenance handling behind our back."""
        kwargs = {
            key: value
            for key, value in self._client.connection_pool.connection_kwargs.items()
            if key != "retry" and not key.startswith(("maint_notifications", "orig_"))
        }
        kwargs.update(socket_timeout=None, decode_responses=False, protocol=2)
        return cast(Any, self._client.connection_pool.connection_class)(**kwargs)

    async def _run(self) -> None:
        delay = 0.02
        while True:
            conn = None
            try:
                conn = self._connection()
                # The handshake has no read timeout of its own: bounded here.
                async with asyncio.timeout(self._backend._connect_timeout + health_interval(self._ttl)):
                    await conn.connect()
                self._conn = conn
                self._connected.set()
                self._settled.set()
                wanted = list(self._names) + list(self._routes)
                # Waiters that arrived while disconnected were not confirmed:
                # wake everyone once the server confirms each channel again.
                resubscribing = set(wanted)
                if wanted:
                    await conn.send_command("SUBSCRIBE", *wanted)
                while True:
                    message = await next_message(conn, health_interval(self._ttl))
                    delay = 0.02
                    self._handle(message, resubscribing)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                error = self._backend.error(exc)
                if isinstance(error, ConfigurationError):
                    error.__cause__ = exc
                    self.failure = error
                    logger.warning("redis pub/sub connection refused, not retrying: %s", error)
                else:
                    logger.info("redis pub/sub connection lost, reconnecting: %s", self._backend.describe(exc))
            finally:
                self._connected.clear()
                self._settled.set()
                self._conn = None
                for futures in self._pending.values():
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
                self._pending.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()
            if self.failure is not None:
                # No retry can fix it: wake every waiter, which sees the failure.
                for _, on_resync in list(self._routes.values()):
                    on_resync()
                if self._names:
                    self._hooks.wake_all()
                return
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
