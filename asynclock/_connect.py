"""``connect(url)``: pick the backend from the URL scheme (or the given client)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ._locks import EventCallback, Locks
from ._validate import check_ttl
from .abc import Backend

#: Options that asynclock reads from a URL's query string (the rest goes to the client library).
_OWN_OPTIONS = {"ttl", "prefix"}

_PLANNED: dict[str, str] = {}


def connect(
    target: str | Any,
    *,
    ttl: float | None = None,
    prefix: str | None = None,
    on_event: EventCallback | None = None,
    **options: Any,
) -> Locks:
    """A lock client for ``target``: a URL, or an existing client object.

    =====================================  ===============================
    ``memory://``                          in this process, no server
    ``redis://host:port/db``, ``rediss://``, ``unix:///path.sock``  one Redis
    a ``redis.asyncio.Redis`` instance     one Redis, not closed by asynclock
    ``postgresql://user@host:port/db``     PostgreSQL (also ``postgres://``)
    an ``asyncpg.Pool``                    PostgreSQL, not closed by asynclock
    ``redlock://h1:p1,h2:p2,h3:p3``        a majority of N independent Redis primaries
    ``redis+sentinel://s1:p1,s2:p2/name``  the Redis primary that Sentinel names
    ``redis+cluster://h1:p1,h2:p2``        Redis Cluster (also a ``RedisCluster`` instance)
    ``zk://h1:p1,h2:p2/optional/chroot``   a ZooKeeper ensemble; the lease is the session
                                           (``?session_timeout=``, default the ``ttl``)
    =====================================  ===============================

    ``ttl`` (seconds, default 30) is the lease time the watchdog keeps renewing;
    ``prefix`` namespaces every key (default ``"asynclock"``); ``on_event`` is
    called with a :class:`LockEvent` for each acquire, release, renewal, loss
    and timeout. Both may also come as URL query parameters
    (``redis://h:6379/0?ttl=10&prefix=app``); other query parameters and
    ``options`` go to the client library.

    No I/O happens here; the connection is made when the returned client is
    entered (``async with``) or first used. Raises ValueError for an unknown
    scheme or a bad option, TypeError for an unsupported object.
    """
    if isinstance(target, str):
        backend, url_opts = _from_url(target, prefix, options, ttl)
    else:
        backend, url_opts = _from_client(target, prefix, options), {}
    chosen_ttl = ttl if ttl is not None else url_opts.get("ttl", 30.0)
    return Locks(backend, ttl=check_ttl(chosen_ttl), on_event=on_event)


def _split_query(url: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    own = {key: query.pop(key) for key in list(query) if key in _OWN_OPTIONS}
    rest = urlunsplit(parts._replace(query=urlencode(query)))
    return rest, own


def _from_url(
    url: str, prefix: str | None, options: dict[str, Any], ttl: float | None = None
) -> tuple[Backend, dict[str, Any]]:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    rest, own = _split_query(url)
    url_opts: dict[str, Any] = {}
    if "ttl" in own:
        try:
            url_opts["ttl"] = check_ttl(float(own["ttl"]))
        except ValueError as exc:
            raise ValueError(f"bad ttl in URL: {own['ttl']!r}") from exc
    chosen_prefix = _check_prefix(prefix if prefix is not None else own.get("prefix", "asynclock"))
    if scheme == "memory":
        if options:
            raise ValueError(f"memory:// takes no options, got {sorted(options)}")
        from .backends.memory import MemoryBackend

        return MemoryBackend(prefix=chosen_prefix), url_opts
    if scheme in ("redis", "rediss", "unix"):
        from .backends.redis import RedisBackend

        return RedisBackend.from_url(rest, prefix=chosen_prefix, **options), url_opts
    if scheme in ("postgresql", "postgres"):
        from .backends.postgres import PostgresBackend

        return PostgresBackend.from_url(rest, prefix=chosen_prefix, **options), url_opts
    if scheme == "zk":
        from .backends.zookeeper import ZooKeeperBackend

        # the lease is the session: its timeout defaults to the client's ttl
        session_ttl = check_ttl(ttl) if ttl is not None else url_opts.get("ttl", 30.0)
        return ZooKeeperBackend.from_url(rest, prefix=chosen_prefix, ttl=session_ttl, **options), url_opts
    if scheme == "redlock":
        from .backends.redlock import RedlockBackend

        return RedlockBackend.from_url(rest, prefix=chosen_prefix, **options), url_opts
    if scheme == "redis+sentinel":
        from .backends.sentinel import SentinelBackend

        return SentinelBackend.from_url(rest, prefix=chosen_prefix, **options), url_opts
    if scheme == "redis+cluster":
        from .backends.cluster import ClusterBackend

        return ClusterBackend.from_url(rest, prefix=chosen_prefix, **options), url_opts
    if scheme in _PLANNED:
        raise ValueError(f"the {_PLANNED[scheme]} backend ({scheme}://) is not available in this version")
    known = (
        "memory://, redis://, rediss://, unix://, postgresql://, postgres://, zk://,"
        " redlock://, redis+sentinel://, redis+cluster://"
    )
    raise ValueError(f"unknown lock URL scheme {scheme!r} in {url!r}; supported: {known}")


def _from_client(client: Any, prefix: str | None, options: dict[str, Any] | None = None) -> Backend:
    chosen_prefix = _check_prefix(prefix if prefix is not None else "asynclock")
    if type(client).__module__.startswith("asyncpg"):
        import asyncpg

        if isinstance(client, asyncpg.Pool):
            from .backends.postgres import PostgresBackend

            return PostgresBackend(client, prefix=chosen_prefix, **(options or {}))
    try:
        import redis.asyncio as aioredis
    except ImportError:  # pragma: no cover - depends on the environment
        aioredis = None  # type: ignore[assignment]
    if aioredis is not None and isinstance(client, aioredis.RedisCluster):
        from .backends.cluster import ClusterBackend

        return ClusterBackend(client, prefix=chosen_prefix, owns_client=False)
    if aioredis is not None and isinstance(client, aioredis.Redis):
        from .backends.redis import RedisBackend

        return RedisBackend(client, prefix=chosen_prefix, owns_client=False, **(options or {}))
    raise TypeError(
        f"connect() takes a URL, a redis.asyncio.Redis client or an asyncpg.Pool, not {type(client).__name__}"
    )


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be str, not {type(prefix).__name__}")
    if not prefix or any(ch in prefix for ch in "{}"):
        raise ValueError(f"prefix must be non-empty and contain no braces, got {prefix!r}")
    return prefix
