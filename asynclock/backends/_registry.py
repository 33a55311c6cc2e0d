"""Where a URL scheme is bound to a backend: the one table ``connect(url)`` reads.

Each entry opens a backend from the URL (the scheme included) with the
client's own options, importing the backend's module only then, so that a
backend whose client library is not installed costs nothing until it is
named. Adding a backend is one entry here (see the architecture page's
"Writing a backend").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._validate import check_ttl
from ..abc import Backend

__all__ = ["SCHEMES", "Common", "Scheme"]


@dataclass(frozen=True, slots=True)
class Common:
    """What every backend is opened with: the key prefix, the connect timeout, and the
    client's ttl when one was given, not checked yet (None: the backend's default, or the one it chooses)."""

    prefix: str
    connect_timeout: float
    ttl: float | None


@dataclass(frozen=True, slots=True)
class Scheme:
    """One backend's URL schemes, and how a URL of them opens it.

    ``open`` returns the backend and the ttl it chose for the client when the
    client gave none (None: the client's default).
    """

    schemes: tuple[str, ...]
    open: Callable[[str, Common, dict[str, Any]], tuple[Backend, float | None]]


def _memory(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .memory import MemoryBackend

    return MemoryBackend.from_url(url, prefix=common.prefix, **options), None


def _redis(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .redis import RedisBackend

    return RedisBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _sentinel(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .redis.sentinel import SentinelBackend

    return SentinelBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _cluster(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .redis.cluster import ClusterBackend

    return ClusterBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _redlock(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .redis.redlock import RedlockBackend

    return RedlockBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _postgres(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .postgres import PostgresBackend

    return PostgresBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _mysql(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .mysql import MySQLBackend

    return MySQLBackend.from_url(url, prefix=common.prefix, connect_timeout=common.connect_timeout, **options), None


def _zookeeper(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .zookeeper import ZooKeeperBackend

    # The lease is the session: the backend chooses the ttl and the session
    # timeout together (the client's ttl follows a given session_timeout).
    backend = ZooKeeperBackend.from_url(
        url,
        ttl=None if common.ttl is None else check_ttl(common.ttl),
        prefix=common.prefix,
        connect_timeout=common.connect_timeout,
        **options,
    )
    return backend, backend.ttl


def _etcd(url: str, common: Common, options: dict[str, Any]) -> tuple[Backend, float | None]:
    from .etcd import EtcdBackend

    # one etcd lease per client, whose TTL is the client's ttl
    ttl = 30.0 if common.ttl is None else check_ttl(common.ttl)
    return EtcdBackend.from_url(
        url, ttl=ttl, prefix=common.prefix, connect_timeout=common.connect_timeout, **options
    ), None


#: Every backend ``connect(url)`` knows, by scheme, in the order the docs list them.
SCHEMES: dict[str, Scheme] = {
    scheme: entry
    for entry in (
        Scheme(("memory",), _memory),
        Scheme(("redis", "rediss", "unix"), _redis),
        Scheme(("postgresql", "postgres"), _postgres),
        Scheme(("mysql", "mariadb"), _mysql),
        Scheme(("zk",), _zookeeper),
        Scheme(("etcd", "etcds"), _etcd),
        Scheme(("redlock",), _redlock),
        Scheme(("redis+sentinel",), _sentinel),
        Scheme(("redis+cluster",), _cluster),
    )
    for scheme in entry.schemes
}
