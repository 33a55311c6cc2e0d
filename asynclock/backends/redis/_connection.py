"""The edge between asynclock and redis-py: one client, its errors, its scripts.

* :func:`translate` is the error table: redis-py's errors (and the socket and
  TLS errors it wraps) become ``ConfigurationError`` (what no retry fixes),
  ``BackendUnavailable`` (unreachable, not answering, READONLY, loading) or
  ``LockError``, naming the server and never a password; the original is the
  ``__cause__``. Every request goes through a :class:`Connection`'s ``edge``
  (the backends' one error edge, ``backends/_edge.py``, with this table).
* :class:`Script` is a Lua script read from this package's ``_scripts``
  directory; :meth:`Connection.run` calls it by its SHA and loads it again
  when the server answers NOSCRIPT (a flushed cache, a restarted or
  failed-over server).
* :meth:`Connection.call` runs a script on the hot path's own connections
  (``_wire.py``; through the client on a Cluster, which routes it by slot);
  with ``replicas=N``, :meth:`Connection.call_confirmed` sends the script and
  ``WAIT N`` on one connection in one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import socket
import ssl
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._errors import BackendUnavailable, ConfigurationError, LockError, plain
from ..._options import mask_text
from .._edge import MapErrors, Translate
from ._wire import Lanes, bulk, evalsha, unbulk

__all__ = [
    "FENCE_LIFETIME_MS",
    "GIVEN_CLIENT_HINT",
    "Connection",
    "Script",
    "address",
    "is_readonly",
    "ms",
    "password_hint",
    "refusal",
    "tag",
    "translate",
    "unreachable",
]

#: How long a lock's last fencing token outlives its last acquisition, in ms.
FENCE_LIFETIME_MS = 24 * 3600 * 1000
#: ``SCRIPT LOAD``, its text to follow.
_LOAD = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"


def ms(seconds: float) -> int:
    """Seconds to a PEXPIRE argument: never 0 or negative (that would delete the key)."""
    return max(1, math.ceil(seconds * 1000))


def text(value: Any) -> str | None:
    """A reply (bytes, str, or None) as text."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# -- scripts -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script: its text and the SHA1 that EVALSHA names it by."""

    name: str
    text: str
    sha: str

    @property
    def sha_bytes(self) -> bytes:
        return self.sha.encode()

    @classmethod
    def load(cls, *files: str, replace: tuple[str, str] | None = None) -> Script:
        """The script made of ``files`` (in ``_scripts``, joined in order), ``replace`` applied."""
        folder = resources.files(__package__).joinpath("_scripts")
        body = "\n".join(folder.joinpath(name).read_text("utf-8") for name in files)
        if replace is not None:
            old, new = replace
            assert old in body, f"{old!r} is not in {files}"
            body = body.replace(old, new)
        return cls(files[-1], body, hashlib.sha1(body.encode("utf-8")).hexdigest())


# -- errors ------------------------------------------------------------------------


def address(kwargs: dict[str, Any]) -> str:
    """The server a redis-py connection's settings point at: ``host:port`` or the socket path."""
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def tag(exc: BaseException, where: str, hint: str | None = None) -> None:
    """Let ``exc`` name the server it came from, when that is more precise than the connection's own
    name, and ``hint`` how to give that server a password (see :func:`password_hint`)."""
    exc.asynclock_where = where  # type: ignore[attr-defined]
    if hint is not None:
        exc.asynclock_hint = hint  # type: ignore[attr-defined]


def password_hint(scheme: str, hosts: str, path: str = "") -> str:
    """How to give a server the password it wants, for a client made from a ``scheme://hosts/path`` URL."""
    return (
        f"put it in the URL, {scheme}://:PASSWORD@{hosts}{path}"
        f" (or {scheme}://USERNAME:PASSWORD@{hosts}{path} for an ACL user)"
    )


#: For a client the application made and passed to ``connect()``.
GIVEN_CLIENT_HINT = "give the client you passed to connect() one (password=, and username= for an ACL user)"


def _wants_password(error: BaseException) -> bool:
    """The server wants a password and was given none (Redis 6+ answers HELLO so, older ones NOAUTH)."""
    words = str(error)
    return "HELLO must be called with the client already authenticated" in words or words.startswith(
        ("NOAUTH", "Authentication required")
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it (redis-py wraps socket and TLS errors, sometimes twice)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _refused_in_script(error: BaseException) -> bool:
    """An ACL refusal of a command (or key, or channel) inside a script: redis-py gives it as a
    plain ResponseError ("The user executing the script can't …", or NOPERM in its text)."""
    if not isinstance(error, redis_errors.ResponseError):
        return False
    words = str(error)
    return "The user executing the script can't" in words or "NOPERM" in words


def refusal(exc: BaseException, hint: str = GIVEN_CLIENT_HINT) -> str | None:
    """What the server refused if no retry can fix it (credentials, ACL, database, TLS), else None.

    ``hint`` says how to give the server a password, for a server that wants one and got none.
    """
    for error in _chain(exc):
        if isinstance(error, redis_errors.AuthenticationError) and _wants_password(error):
            hint = next((said for e in _chain(exc) if (said := getattr(e, "asynclock_hint", None))), hint)
            return f"wants a password, and none was given: {hint} (the server said {str(error)!r})"
        if isinstance(error, (redis_errors.AuthenticationError, redis_errors.AuthenticationWrongNumberOfArgsError)):
            return f"refused the credentials: {str(error)!r}"
        if isinstance(error, redis_errors.NoPermissionError):
            return f"refused permission (ACL): {str(error)!r}"
        if _refused_in_script(error):
            return f"refused permission (ACL) to what asynclock's scripts do: {str(error)!r}"
        if isinstance(error, redis_errors.ResponseError) and "DB index is out of range" in str(error):
            return f"has no such database: {str(error)!r}"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"presented a TLS certificate that was refused: {error.verify_message or error.reason or error}"
    return None


def unreachable(exc: BaseException, connect_timeout: float | None) -> str | None:
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


def is_readonly(exc: BaseException) -> bool:
    """A READONLY reply: a replica, or a primary demoted by a failover.

    redis-py turns it into ReadOnlyError (with the code stripped from the
    message); a bare ResponseError keeps the "READONLY" prefix.
    """
    return isinstance(exc, redis_errors.ReadOnlyError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("READONLY")
    )


def translate(
    exc: BaseException,
    where: str = "Redis",
    *,
    connect_timeout: float | None = None,
    secrets: Iterable[str | None] = (),
    unavailable: tuple[type[BaseException], ...] = (),
    hint: str = GIVEN_CLIENT_HINT,
) -> BaseException:
    """Map redis-py errors onto ours, naming ``where`` (the original becomes ``__cause__``).

    ``where`` names the server ("Redis at host:port"); ``secrets`` (passwords)
    are masked in every message; ``unavailable`` are further error types that
    mean "not reachable right now" (a Cluster client's own); ``hint`` says how
    to give the server a password, should it want one and get none.
    """
    # (a connection that knows better which server it talked to tags its errors)
    at = next((tag for error in _chain(exc) if (tag := getattr(error, "asynclock_where", None))), where)
    refused = refusal(exc, hint)
    if refused is not None:
        return ConfigurationError(mask_text(f"{at} {refused}", secrets))
    if is_readonly(exc):
        return BackendUnavailable(mask_text(f"{at} answered READONLY (a replica or demoted primary): {exc}", secrets))
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, TimeoutError)):
        cause = unreachable(exc, connect_timeout)
        if cause is not None:
            error = BackendUnavailable(mask_text(f"{at} could not be reached: {cause}", secrets))
            error.connect_timeout = connect_timeout
            return error
        if isinstance(exc, redis_errors.BusyLoadingError):
            return BackendUnavailable(mask_text(f"{at} is loading its data: {exc}", secrets))
        return BackendUnavailable(mask_text(f"{at} did not answer: {plain(exc)}", secrets))
    if isinstance(exc, unavailable):
        # no node reachable yet, or a cluster settling (CLUSTERDOWN, TRYAGAIN)
        cause = unreachable(exc, connect_timeout)
        error = BackendUnavailable(mask_text(f"{at} is not available: {cause or plain(exc)}", secrets))
        if cause is not None:
            error.connect_timeout = connect_timeout
        return error
    if isinstance(exc, redis_errors.RedisError):
        return LockError(mask_text(f"{at}: Redis error: {exc}", secrets))
    return exc


class Connection:
    """A redis-py client (a ``Redis`` or a ``RedisCluster``) as asynclock uses it.

    ``where`` names the server in messages ("Redis at host:port"), never with
    a password; ``secrets`` are masked wherever redis-py's or the server's
    words are quoted; ``hint`` says how to give the server a password (see
    :func:`password_hint`). ``replicas``: replicas that must confirm a write
    (``run_then_wait``); 0: do not wait.
    """

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        where: str,
        connect_timeout: float,
        secrets: Iterable[str | None] = (),
        unavailable: tuple[type[BaseException], ...] = (),
        replicas: int = 0,
        replica_timeout: float = 0.5,
        owns_client: bool = False,
        hint: str = GIVEN_CLIENT_HINT,
    ) -> None:
        self.client = client
        self.where = where
        self.connect_timeout = connect_timeout
        self.replicas = replicas
        self.replica_timeout_ms = ms(replica_timeout)
        self._secrets = list(secrets)  # (add_secret extends this very list, which the edge masks)
        self._owns_client = owns_client
        #: redis-py's error (or one it wraps) in, asynclock's out, naming this server, passwords masked.
        self.error: Translate = functools.partial(
            translate,
            where=where,
            connect_timeout=connect_timeout,
            secrets=self._secrets,
            unavailable=unavailable,
            hint=hint,
        )
        #: ``with connection.edge:`` around any call into redis-py.
        self.edge = MapErrors(self.error, (redis_errors.RedisError, OSError, *unavailable))
        # the hot path's own connections (one server's client only)
        self._lanes = Lanes(client.connection_pool) if isinstance(client, aioredis.Redis) else None

    def add_secret(self, secret: str | None) -> None:
        """Mask ``secret`` too (a password given to a part of the client made elsewhere)."""
        self._secrets.append(secret)

    def describe(self, exc: BaseException) -> str:
        """``exc`` in words for a log line (as asynclock would raise it): passwords masked."""
        error = self.error(exc)
        return str(error) if error is not exc else mask_text(plain(exc), self._secrets)

    async def run(self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | int | bytes]) -> Any:
        """Run ``script`` (loading it again if the server does not have it); errors translated.

        A cancellation of the caller that arrives meanwhile is raised, even
        if the client returned the reply instead: redis-py's Cluster client
        (8.1, on Python 3.11) can drop one that comes with the reply, and the
        caller would wait on.
        """
        client = self.client
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        with self.edge:
            try:
                answer = await client.evalsha(script.sha, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                await client.script_load(script.text)
                answer = await client.evalsha(script.sha, len(keys), *keys, *args)
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        return answer

    async def call(self, script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> Any:
        """Run ``script`` on a connection of the hot path (keys and args RESP-encoded); errors translated.

        On a Cluster client, through the client (which routes it by its keys' slot).
        """
        lanes = self._lanes
        if lanes is None:
            return await self.run(script, [unbulk(key) for key in keys], [unbulk(arg) for arg in args])
        command = evalsha(script.sha_bytes, keys, args)
        with self.edge:
            [answer] = await lanes.request(command)
            if isinstance(answer, redis_errors.NoScriptError):
                # (a flushed script cache, a restarted or failed-over server):
                # loaded, and the call sent again, in one round trip
                loaded, answer = await lanes.request(_LOAD + bulk(script.text) + command, 2)
                if isinstance(loaded, BaseException):
                    raise loaded
            if isinstance(answer, BaseException):
                raise answer
        return answer

    async def call_confirmed(self, script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> tuple[Any, int]:
        """``call``, then WAIT for the replicas on the same connection, in the same round trip.

        Returns the script's answer and how many replicas confirmed it (and
        every earlier write of this connection) within the replica timeout.
        """
        [answer], confirmed = await self.call_many(script, [(keys, args)], wait=True)
        if isinstance(answer, BaseException):
            raise answer
        assert confirmed is not None
        return answer, confirmed

    async def call_many(
        self, script: Script, calls: Sequence[tuple[Sequence[bytes], Sequence[bytes]]], *, wait: bool = False
    ) -> tuple[list[Any], int | None]:
        """Run ``script`` once per (keys, args) of ``calls``, pipelined in one write.

        Returns each call's answer (an error reply as asynclock's error, in
        its place) and, with ``wait``, how many replicas confirmed them all.
        On a Cluster client (no ``wait``), one call after the other, each
        routed by its keys' slot.
        """
        lanes = self._lanes
        if lanes is None:
            assert not wait, "one server's client only"
            answers: list[Any] = []
            for keys, args in calls:
                try:
                    answers.append(await self.call(script, keys, args))
                except LockError as exc:
                    answers.append(exc)
            return answers, None
        commands = [evalsha(script.sha_bytes, keys, args) for keys, args in calls]
        waiting = b"*3\r\n$4\r\nWAIT\r\n" + bulk(self.replicas) + bulk(self.replica_timeout_ms) if wait else b""
        with self.edge:
            replies = await lanes.request(b"".join(commands) + waiting, len(commands) + wait)
            missing = [i for i in range(len(commands)) if isinstance(replies[i], redis_errors.NoScriptError)]
            if missing:
                # (a flushed script cache, a restarted or failed-over server):
                # loaded, and the calls sent again, in one round trip
                again = await lanes.request(
                    _LOAD + bulk(script.text) + b"".join(commands[i] for i in missing) + waiting,
                    1 + len(missing) + wait,
                )
                if isinstance(again[0], BaseException):
                    raise again[0]
                for i, answer in zip(missing, again[1:], strict=False):
                    replies[i] = answer
                if wait:
                    replies[-1] = again[-1]
            confirmed: int | None = None
            if wait:
                last = replies.pop()
                if isinstance(last, BaseException):
                    raise last
                confirmed = int(last)
        for i, answer in enumerate(replies):
            if isinstance(answer, BaseException):
                error = self.error(answer)
                error.__cause__ = answer
                replies[i] = error
        return replies, confirmed

    async def scan(self, pattern: str) -> list[str]:
        """The keys that match ``pattern`` (SCAN, in batches)."""
        with self.edge:
            return [text(key) or "" async for key in self.client.scan_iter(match=pattern, count=1000)]

    async def aclose(self) -> None:
        """Close the hot path's connections, and the client if this connection made it."""
        if self._lanes is not None:
            await self._lanes.aclose()
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self.client.aclose()
