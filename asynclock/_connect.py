"""``connect(url)``: pick the backend from the URL scheme (or the given client)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._client import EventCallback, Locks
from ._errors import ConfigurationError
from ._guarantees import TABLE, WORDS, check_words, missing
from ._options import DEFAULT_CONNECT_TIMEOUT, mask_url, seconds, suggest, take_query
from ._validate import check_ttl
from .abc import Backend
from .backends._registry import SCHEMES, Common

#: Options that asynclock reads from a URL's query string for every backend.
_OWN_OPTIONS = {"ttl", "prefix", "connect_timeout"}


def connect(
    target: str | Any,
    *,
    ttl: float | None = None,
    prefix: str | None = None,
    on_event: EventCallback | None = None,
    connect_timeout: float | None = None,
    require: Iterable[str] | None = None,
    **options: Any,
) -> Locks:
    """A lock client for ``target``: a URL, or an existing client object.

    * ``memory://``: in this process, no server
    * ``redis://host:port/db``, ``rediss://``, ``unix:///path.sock``: one Redis
    * a ``redis.asyncio.Redis`` instance: one Redis, not closed by asynclock
    * ``postgresql://user@host:port/db`` (also ``postgres://``): PostgreSQL
    * an ``asyncpg.Pool``: PostgreSQL, not closed by asynclock
    * ``mysql://user:password@host:3306/db`` (also ``mariadb://``): MySQL or MariaDB
    * ``redlock://h1:p1,h2:p2,h3:p3``: a majority of N independent Redis primaries
    * ``redis+sentinel://s1:p1,s2:p2/name``: the Redis primary that Sentinel names
    * ``redis+cluster://h1:p1,h2:p2``: Redis Cluster (also a ``RedisCluster`` instance)
    * ``zk://h1:p1,h2:p2/optional/chroot``: a ZooKeeper ensemble; the lease is the
      session (``?session_timeout=``, default the ``ttl``; without a ``ttl`` the
      ttl follows it)
    * ``etcd://h1:p1,h2:p2/optional/path`` (``etcds://`` for TLS): an etcd cluster,
      etcd's Mutex recipe, one etcd lease per client

    ``ttl`` (seconds, default 30) is the lease time the watchdog keeps renewing;
    ``prefix`` namespaces every key (default ``"asynclock"``); ``on_event`` is
    called with a :class:`LockEvent` for each acquire, release, renewal, loss
    and timeout; ``connect_timeout`` (seconds, default 5) bounds connecting:
    a refused connection or an unresolvable host raises
    :class:`BackendUnavailable` within it. ``ttl``, ``prefix`` and
    ``connect_timeout`` may also come as URL query parameters
    (``redis://h:6379/0?ttl=10&prefix=app``); the backend's own options and
    those of its client library may come either way too.

    ``require`` is a set of guarantees the application relies on (the words
    of :attr:`Locks.guarantees`, e.g. ``{"fencing"}``): a backend that, as
    configured, does not give one of them raises :class:`ConfigurationError`
    naming what it lacks, and a word that is not one of them raises
    ValueError; both before any I/O.

    No I/O happens here; the connection is made when the returned client is
    entered (``async with``) or first used.

    Example::

        async with asynclock.connect("redis://localhost:6379/0", ttl=10) as locks:
            async with locks.lock("orders:42") as lease:
                ...

    Raises ValueError for an unknown scheme, an unknown option (naming the
    valid ones) or a bad value, and TypeError for an unsupported object.
    """
    required = check_words(require) if require is not None else frozenset()
    if connect_timeout is not None:
        connect_timeout = seconds(connect_timeout, "connect_timeout")
    if isinstance(target, str):
        backend, url_opts = _from_url(target, prefix, options, ttl, connect_timeout)
    else:
        chosen = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        backend, url_opts = _from_client(target, prefix, options, chosen), {"connect_timeout": chosen}
    chosen_ttl = ttl if ttl is not None else url_opts.get("ttl", 30.0)
    locks = Locks(backend, ttl=check_ttl(chosen_ttl), on_event=on_event, connect_timeout=url_opts["connect_timeout"])
    lacking = missing(required, locks.guarantees)
    if lacking:
        raise ConfigurationError(_lacking(backend.scheme, lacking, locks.guarantees))
    return locks


def _lacking(scheme: str, lacking: list[str], offered: frozenset[str]) -> str:
    """Why ``connect(require=...)`` refused: what is missing, what there is, and where a variant has it."""
    what = ", ".join(f"{word!r} ({WORDS[word]})" for word in lacking)
    has = ", ".join(word for word in WORDS if word in offered) or "none of the words"
    message = f"the {scheme} backend, as configured, does not guarantee {what}; it guarantees: {has}"
    variant = TABLE.get(f"{scheme}+replicas")
    if variant is not None and not missing(frozenset(lacking), variant.words):
        message += "; with replicas=N (replicas that confirm every acquire and renewal) it does"
    return message


def _from_url(
    url: str,
    prefix: str | None,
    options: dict[str, Any],
    ttl: float | None = None,
    connect_timeout: float | None = None,
) -> tuple[Backend, dict[str, Any]]:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    rest, own = take_query(url, _OWN_OPTIONS)
    url_opts: dict[str, Any] = {}
    if "ttl" in own:
        try:
            url_opts["ttl"] = check_ttl(float(own["ttl"]))
        except ValueError as exc:
            raise ValueError(f"bad ttl in URL: {own['ttl']!r}") from exc
    chosen_prefix = _check_prefix(prefix if prefix is not None else own.get("prefix", "asynclock"))
    if connect_timeout is None:
        connect_timeout = seconds(own.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT), "connect_timeout")
    url_opts["connect_timeout"] = connect_timeout
    given_ttl = ttl if ttl is not None else url_opts.get("ttl")
    entry = SCHEMES.get(scheme)
    if entry is None:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        guess = suggest(scheme, SCHEMES)
        hint = f" (did you mean {guess}://?)" if guess else ""
        raise ValueError(f"unknown lock URL scheme {scheme!r} in {mask_url(url)!r}{hint}; supported: {known}")
    backend, chosen_ttl = entry.open(rest, Common(chosen_prefix, connect_timeout, given_ttl), options)
    if chosen_ttl is not None:
        url_opts.setdefault("ttl", chosen_ttl)
    return backend, url_opts


def _from_client(client: Any, prefix: str | None, options: dict[str, Any], connect_timeout: float) -> Backend:
    chosen_prefix = _check_prefix(prefix if prefix is not None else "asynclock")
    if type(client).__module__.startswith("asyncpg"):
        import asyncpg

        if isinstance(client, asyncpg.Pool):
            from .backends.postgres import PostgresBackend

            return PostgresBackend.from_pool(client, prefix=chosen_prefix, connect_timeout=connect_timeout, **options)
    try:
        import redis.asyncio as aioredis
    except ImportError:  # pragma: no cover - depends on the environment
        aioredis = None  # type: ignore[assignment]
    if aioredis is not None and isinstance(client, aioredis.RedisCluster):
        from .backends.cluster import ClusterBackend

        return ClusterBackend.from_client(client, prefix=chosen_prefix, connect_timeout=connect_timeout, **options)
    if aioredis is not None and isinstance(client, aioredis.Redis):
        from .backends.redis import RedisBackend

        return RedisBackend.from_client(client, prefix=chosen_prefix, connect_timeout=connect_timeout, **options)
    raise TypeError(
        f"connect() takes a URL, a redis.asyncio.Redis client or an asyncpg.Pool, not {type(client).__name__}"
    )


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be str, not {type(prefix).__name__}")
    if not prefix or any(ch in prefix for ch in "{}"):
        raise ValueError(f"prefix must be non-empty and contain no braces, got {prefix!r}")
    return prefix
