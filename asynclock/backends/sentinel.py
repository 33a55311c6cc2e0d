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
only as long as the fence counter survives (see ``_redis_scripts``: after a
failover that lost it, the time floor keeps new tokens above old ones).

A demoted primary answers writes with READONLY. The connection used here
re-resolves the primary after such an answer but still reports it, so a
renewal that reaches the demoted primary counts as "not the holder" (loss),
never as success, and an acquire there is retried on the new primary.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis Sentinel backend needs redis-py: pip install 'asynclock[redis]'") from exc

from .._options import DEFAULT_CONNECT_TIMEOUT
from .redis import RedisBackend, _check_replicas

__all__ = ["SentinelBackend"]


class _FollowingConnection(SentinelManagedConnection):
    """Re-resolves the primary after READONLY, and still reports the READONLY.

    redis-py turns READONLY from a primary into a ConnectionError, which a
    renewal would treat as "try again"; a lock must treat it as "not yours
    here", so the original error is kept.
    """

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


class SentinelBackend(RedisBackend):
    """Locks on the primary that a group of sentinels names.

    Example::

        async with asynclock.connect("redis+sentinel://s1:26379,s2:26379/mymaster") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    kind = "redis+sentinel"

    def __init__(
        self,
        sentinel: Sentinel,
        client: aioredis.Redis,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        super().__init__(
            client, prefix=prefix, owns_client=owns_client, replicas=replicas, replica_timeout=replica_timeout
        )
        self._sentinel = sentinel

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
        to the data connections (``socket_timeout``, ``db``, …), except
        ``replicas`` and ``replica_timeout``, which work as on ``redis://``
        (each acquire and renewal confirmed by that many replicas, so that a
        failover to one of them keeps the lock).
        """
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        addresses: list[tuple[str, int]] = []
        for host in hosts.split(","):
            name, _, port = host.strip().rpartition(":")
            if not name or not port.isdigit():
                raise ValueError(f"a Sentinel URL names its sentinels as host:port, got {host!r} in {url!r}")
            addresses.append((name, int(port)))
        path = [piece for piece in parts.path.split("/") if piece]
        if not path or len(path) > 2:
            raise ValueError(f"a Sentinel URL ends in /service_name[/db], got {url!r}")
        service = unquote(path[0])
        kwargs: dict[str, Any] = dict(parse_qsl(parts.query))
        for key in ("socket_timeout", "socket_connect_timeout"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        if len(path) == 2:
            kwargs["db"] = int(path[1])
        if userinfo:
            user, _, password = userinfo.partition(":")
            if user:
                kwargs["username"] = unquote(user)
            if password:
                kwargs["password"] = unquote(password)
        kwargs.update(options)
        kwargs.setdefault("socket_connect_timeout", connect_timeout)
        replicas: Any = kwargs.pop("replicas", 0)
        replica_timeout: Any = kwargs.pop("replica_timeout", 0.5)
        try:  # URL query values are text
            replicas = int(replicas) if isinstance(replicas, str) else replicas
            replica_timeout = float(replica_timeout) if isinstance(replica_timeout, str) else replica_timeout
        except ValueError as exc:
            raise ValueError(f"bad replicas/replica_timeout option in the URL: {exc}") from None
        _check_replicas(replicas, replica_timeout)  # before any connection exists
        sentinel_kwargs: dict[str, Any] = {
            key: value for key, value in kwargs.items() if key in ("socket_timeout", "socket_connect_timeout")
        }
        sentinel_password = kwargs.pop("sentinel_password", None)
        if sentinel_password is not None:
            sentinel_kwargs["password"] = sentinel_password
        sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        client = sentinel.master_for(service, connection_class=_FollowingConnection, **kwargs)
        return cls(
            sentinel, client, prefix=prefix, owns_client=True, replicas=replicas, replica_timeout=replica_timeout
        )

    @property
    def sentinel(self) -> Sentinel:
        return self._sentinel

    async def aclose(self) -> None:
        owns = self._owns_client
        await super().aclose()
        if owns:
            with contextlib.suppress(Exception):
                await self._sentinel.aclose()
