"""Redis behind Sentinel (``redis+sentinel://s1:p1,s2:p2/mymaster``).

The single-Redis backend on a client that asks the sentinels where the
primary is (redis-py's ``Sentinel.master_for``). Its connections, the pub/sub
listener's included, connect to whatever the sentinels name as the primary
at that moment, so after a failover every request goes to the new primary.

A failover can lose a hold: Redis replicates asynchronously, and a primary
that dies before its replica received the acquire leaves a new primary
without the key. The holder then learns it at its next renewal ("not the
holder": the lease is lost and the body cancelled), or, if the new primary
cannot be reached in time, at its trusted deadline. Meanwhile another client
may already have taken the lock on the new primary: Sentinel gives
availability, not exclusion across a failover. Fencing tokens stay safe
only as long as the fence counter survives (see ``_hash.py``: after a
failover that lost it, the time floor keeps new tokens above old ones).

A demoted primary answers writes with READONLY. The connection used here
re-resolves the primary after such an answer but still reports it, so a
renewal that reaches the demoted primary counts as "not the holder" (loss),
never as success, and an acquire there is retried on the new primary.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import (
        MasterNotFoundError,
        Sentinel,
        SentinelConnectionPool,
        SentinelManagedConnection,
    )
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis Sentinel backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._options import DEFAULT_CONNECT_TIMEOUT, credentials, host_list, mask_url, take_query
from . import RedisBackend
from ._connection import password_hint, refusal, tag, unreachable
from ._private import FORCE_MASTER_IP
from ._urls import OWN_OPTIONS, accepted, check_options, database, replica_options, url_value

__all__ = ["SentinelBackend"]

#: Options of the sentinels themselves (the others go to the data connections).
SENTINEL_OWN = ("sentinel_password",)
#: How to give the sentinels the password they want.
SENTINEL_HINT = (
    "add ?sentinel_password=PASSWORD to the URL (a password before the hosts,"
    " redis+sentinel://:PASSWORD@…, is the data nodes')"
)


class _FollowingConnection(SentinelManagedConnection):
    """Re-resolves the primary after READONLY, and still reports the READONLY.

    redis-py turns READONLY from a primary into a ConnectionError, which a
    renewal would treat as "try again"; a lock must treat it as "not yours
    here", so the original error is kept.
    """

    async def connect_to(self, address: tuple[str, int]) -> None:
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call]
        except redis_errors.RedisError as exc:
            # name the primary the sentinels gave in what the error says
            tag(exc, f"Redis primary {self.connection_pool.service_name!r} at {address[0]}:{address[1]}")
            raise

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super(SentinelManagedConnection, self).read_response(*args, **kwargs)
        except redis_errors.ReadOnlyError as exc:
            if self.connection_pool.is_master:
                await self.disconnect()  # the next request asks the sentinels again
            # redis-py strips the error code from the message; put it back so
            # that the single-Redis backend recognises the answer as READONLY.
            text = str(exc)
            raise redis_errors.ReadOnlyError(text if text.startswith("READONLY") else f"READONLY {text}") from exc


class _Sentinels(Sentinel):
    """Asks each sentinel in turn where the primary is, keeping why each one failed.

    When no sentinel answers, the error says why (the first sentinel's error
    is its cause): every sentinel refused this client (a wrong
    ``sentinel_password``, a TLS certificate) is a refusal no retry can fix,
    none could be connected to is an unreachable group; a sentinel that
    answers without a healthy primary of that name is neither.
    """

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        failures: list[BaseException] = []
        for index, sentinel in enumerate(self.sentinels):
            try:
                masters = cast(dict[str, Any], await sentinel.sentinel_masters())
            except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
                tag(exc, f"Redis sentinel at {_address_of(sentinel)}", SENTINEL_HINT)
                failures.append(exc)
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                # the sentinel that knew is asked first next time
                self.sentinels[0], self.sentinels[index] = sentinel, self.sentinels[0]
                forced = getattr(self, FORCE_MASTER_IP, None)
                host = forced if forced is not None else state["ip"]
                return host, state["port"]
        if failures and len(failures) == len(self.sentinels):
            refused = [error for error in failures if refusal(error) is not None]
            if refused:
                raise refused[0]
            if all(unreachable(error, None) is not None for error in failures):
                raise MasterNotFoundError(f"no sentinel could be reached for {service_name!r}") from failures[0]
        raise MasterNotFoundError(f"no sentinel names a healthy primary {service_name!r}")


def _address_of(client: aioredis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


def sentinel_options() -> dict[str, Any]:
    """What redis-py's Sentinel and ``master_for`` take, for the sentinels and the data connections."""
    found = accepted(Sentinel, Sentinel.master_for, SentinelConnectionPool, _FollowingConnection)
    for ours in ("sentinels", "service_name", "sentinel_manager", "connection_pool", "connection_class"):
        found.pop(ours, None)
    return found


class SentinelBackend(RedisBackend):
    """Locks on the primary that a group of sentinels names.

    Example::

        async with asynclock.connect("redis+sentinel://s1:26379,s2:26379/mymaster") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    scheme = "redis+sentinel"

    def __init__(
        self,
        sentinel: Sentinel,
        client: aioredis.Redis,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        replicas: int = 0,
        replica_timeout: float = 0.5,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        service: str = "",
        hint: str | None = None,
    ) -> None:
        hosts = ",".join(_address_of(each) for each in sentinel.sentinels)
        super().__init__(
            client,
            prefix=prefix,
            owns_client=owns_client,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
            where=f"Redis primary {service!r} via the sentinels at {hosts}",
            **({} if hint is None else {"hint": hint}),
        )
        self._sentinel = sentinel
        self._owns_sentinel = owns_client
        self.connection.add_secret(getattr(sentinel, "sentinel_kwargs", {}).get("password"))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> SentinelBackend:
        """``redis+sentinel://[:password@]s1:p1,s2:p2/service[/db][?option=…]``.

        The password is the data nodes'; ``sentinel_password`` (query or
        option) is the sentinels'. Other query parameters and ``options`` go
        to redis-py's Sentinel and to the data connections (``socket_timeout``,
        ``db``, …), except ``replicas`` and ``replica_timeout``, which work as
        on ``redis://`` (each acquire and renewal confirmed by that many
        replicas, so that a failover to one of them keeps the lock). Raises
        ValueError for an option none of them takes and for a database that
        is not a number, before any I/O.
        """
        rest, own = take_query(url, (*OWN_OPTIONS, *SENTINEL_OWN))
        parts = urlsplit(rest)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        addresses = host_list(hosts, url, "a Sentinel URL names its sentinels")
        path = [piece for piece in parts.path.split("/") if piece]
        if not path or len(path) > 2:
            raise ValueError(f"a Sentinel URL ends in /service_name[/db], got {mask_url(url)}")
        service = unquote(path[0])
        valid = sentinel_options()
        check_options(
            rest,
            options,
            (*OWN_OPTIONS, *SENTINEL_OWN),
            "redis+sentinel://",
            passed_on=valid,
            others="and what redis-py's Sentinel and its data connections take, such as socket_timeout or password",
        )
        kwargs: dict[str, Any] = {
            key: url_value(key, value, valid.get(key)) for key, value in parse_qsl(parts.query, keep_blank_values=True)
        }
        if len(path) == 2:
            kwargs["db"] = database(path[1], url)
        kwargs.update(credentials(userinfo))
        kwargs.update(options)
        kwargs.setdefault("socket_connect_timeout", connect_timeout)
        replicas, replica_timeout = replica_options(kwargs, own)  # checked before any connection exists
        sentinel_password = kwargs.pop("sentinel_password", own.get("sentinel_password"))
        group = {key: kwargs.pop(key) for key in ("min_other_sentinels", "force_master_ip") if key in kwargs}
        sentinel_kwargs: dict[str, Any] = kwargs.pop("sentinel_kwargs", None) or {
            key: value for key, value in kwargs.items() if key in ("socket_timeout", "socket_connect_timeout")
        }
        # The front retries; redis-py's default backoff (1 s, 2 s, …) between
        # sentinels that refuse would outlast the connect timeout.
        sentinel_kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        if sentinel_password is not None:
            sentinel_kwargs["password"] = sentinel_password
        sentinel = _Sentinels(addresses, sentinel_kwargs=sentinel_kwargs, **group)  # type: ignore[no-untyped-call]
        client = sentinel.master_for(service, connection_class=_FollowingConnection, **kwargs)
        return cls(
            sentinel,
            client,
            prefix=prefix,
            owns_client=True,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
            service=service,
            hint=password_hint("redis+sentinel", hosts, parts.path),
        )

    @property
    def sentinel(self) -> Sentinel:
        return self._sentinel

    async def aclose(self) -> None:
        await super().aclose()
        if self._owns_sentinel:
            with contextlib.suppress(Exception):
                await self._sentinel.aclose()
