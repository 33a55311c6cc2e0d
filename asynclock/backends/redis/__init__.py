"""One Redis server (``redis://``, ``rediss://``, ``unix://``, or a given client).

Every primitive is queued on the server and handed over to the head waiter
inside the release script. The plain lock is the fair lock, as on ZooKeeper
and PostgreSQL: one string while uncontended, and a queue only while
somebody waits (``_exclusive.py``). An election is that lock under keys of
its own, its holds carrying the candidates' identities and its changes of
leader published on a channel of its own (``_election.py``). The
read-write lock and the semaphore are one queued resource in shared modes
(``_shared.py``). An acquire that
finds the lock taken joins the queue in the same request; a hand-over is
announced on a channel of the waiter's client alone (``_queue.py``), which
the client's one pub/sub connection listens to (``_pubsub.py``). With
``replicas=N`` every acquire and renewal of the plain lock is confirmed by N
replicas (WAIT), and a hand-over by a request of the new holder's own.

The package also holds what the other Redis backends are made of:
``_connection.py`` (the client and its errors), ``_hash.py`` (the hash lock
of Cluster and Redlock), ``sentinel.py``, ``cluster.py`` and ``redlock.py``.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

try:
    import redis.asyncio as aioredis
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, mask_text, take_query
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem, unsupported
from .._breaking import break_by_release
from ._connection import GIVEN_CLIENT_HINT, Connection, address, password_hint
from ._election import Elections, RedisLeaderWatch, hold_of, server_hold
from ._exclusive import ExclusiveLock
from ._pubsub import PubSub
from ._queue import Handovers, QueueClient
from ._shared import QueuedResource
from ._urls import (
    OWN_OPTIONS,
    REDIS_PY_OPTIONS,
    check_options,
    check_replicas,
    connection_options,
    database,
    replica_options,
)

__all__ = ["RedisBackend"]

#: The kinds that are one exclusive lock (the plain lock is FIFO: it is the fair lock).
EXCLUSIVE = frozenset({"lock", "fair"})
#: The kinds served by an exclusive lock's scripts (an election is one under keys of its own).
LINED = frozenset({"lock", "fair", "election"})


class RedisBackend:
    """Locks on one Redis server (or a primary with replicas).

    Example::

        async with asynclock.connect("redis://localhost:6379/0") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    scheme = "redis"

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
        hint: str = GIVEN_CLIENT_HINT,
    ) -> None:
        check_replicas(replicas, replica_timeout)
        settings = dict(getattr(client.connection_pool, "connection_kwargs", {}))
        #: The client, its errors and its scripts.
        self.connection = Connection(
            client,
            where=where if where is not None else f"Redis at {address(settings)}",
            connect_timeout=connect_timeout,
            secrets=[settings.get("password")],
            replicas=replicas,
            replica_timeout=replica_timeout,
            owns_client=owns_client,
            hint=hint,
        )
        self._prefix = prefix
        self._pubsub = PubSub(self.connection)
        self._handovers = Handovers(f"{prefix}:handover:{secrets.token_hex(8)}", self._pubsub)
        self._exclusive = ExclusiveLock(self.connection, prefix, self._handovers.channel)
        self._elections = Elections(
            ExclusiveLock(self.connection, prefix, self._handovers.channel, suffix="e", announces=True), self._pubsub
        )
        self._shared = QueuedResource(self.connection, prefix, self._handovers.channel)
        # this client's side of every queue above: acquires, waits for a hand-over, polls, leaves
        self._holds = QueueClient(self.connection, self._handovers)

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
        check_options(
            rest,
            options,
            OWN_OPTIONS,
            f"{parts.scheme}://",
            passed_on=connection_options(connection_class),
            others=REDIS_PY_OPTIONS,
        )
        if parts.scheme.lower() in ("redis", "rediss"):
            database(parts.path, url)
        replicas, replica_timeout = replica_options(options, own)
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
            hint=password_hint(parts.scheme.lower(), parts.netloc.rpartition("@")[2], parts.path),
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
        replicas, replica_timeout = replica_options(options, {})
        return cls(
            client,
            prefix=prefix,
            owns_client=False,
            replicas=replicas,
            replica_timeout=replica_timeout,
            connect_timeout=connect_timeout,
        )

    @property
    def where(self) -> str:
        """The server, as messages name it."""
        return self.connection.where

    @property
    def client(self) -> aioredis.Redis:
        """The redis-py client."""
        client = self.connection.client
        assert isinstance(client, aioredis.Redis)
        return client

    @property
    def replicas(self) -> int:
        """Replicas that must confirm each acquire and renewal (Redis WAIT); 0: none."""
        return self.connection.replicas

    @property
    def guarantees(self) -> frozenset[str]:
        """What it guarantees as configured (``locks.guarantees``): the row of
        :data:`asynclock._guarantees.TABLE` for its scheme, with or without ``replicas``."""
        return TABLE[f"{self.scheme}+replicas" if self.connection.replicas else self.scheme].words

    # -- the request protocol ----------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Every primitive; with ``replicas=`` the plain and fair lock and elections only."""
        if self.connection.replicas and kind in ("read", "write", "semaphore"):
            raise unsupported(
                self.scheme,
                kind,
                "not with replicas= (its hand-overs are not confirmed by the replicas): connect without it",
            )

    def lock_key(self, ref: LockRef) -> str:
        """The lock's own key; the plain and the fair lock of a name are one lock."""
        if ref.kind in EXCLUSIVE:
            return self._exclusive.key(ref.name)
        if ref.kind == "election":
            return self._elections.lock.key(ref.name)
        return self._shared.key(ref)

    def _queue(self, ref: LockRef) -> ExclusiveLock | QueuedResource:
        if ref.kind in EXCLUSIVE:
            return self._exclusive
        return self._elections.lock if ref.kind == "election" else self._shared

    @staticmethod
    def _hold(ref: LockRef, hold: str) -> str:
        """``hold`` as the scripts know it: a candidate's carries its identity."""
        return server_hold(hold, ref.identity) if ref.kind == "election" else hold

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        """No I/O: like redis-py, the first request connects (and a hand-over needs no hooks)."""

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        self._pubsub.note_ttl(ttl)  # its health check keeps up with the locks it serves
        return await self._holds.try_acquire(self._queue(ref), ref, self._hold(ref, hold), ttl, enqueue=enqueue)

    def acquires_many(self, refs: Sequence[LockRef]) -> bool:
        """Plain (and fair) locks: one server has every key, so one script takes them all."""
        return all(ref.kind in EXCLUSIVE for ref in refs)

    async def try_acquire_many(
        self, refs: Sequence[LockRef], holds: Sequence[str], ttl: float
    ) -> list[Acquired] | Busy:
        """Every lock of ``refs`` in one script call, all or none (``exclusive_acquire_all.lua``)."""
        self._pubsub.note_ttl(ttl)
        answer = await self._exclusive.enter_all(refs, holds, ttl)
        if isinstance(answer, list):
            return [Acquired(token) for token in answer]
        return Busy(answer)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """Until the hand-over message arrives or the loop time ``until``; then one poll (``_queue.py``)."""
        return await self._holds.wait_queued(self._queue(ref), ref, self._hold(ref, hold), ttl, until)

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        return await self._queue(ref).set_count(ref, self._hold(ref, hold), count, ttl)

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Release ``hold``, or take it out of the queue (and give back a hand-over that raced in)."""
        hold = self._hold(ref, hold)
        return await self._queue(ref).release(ref, hold, self._holds.leave(ref, hold))

    async def renew(self, items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        first = self._queue(items[0].ref) if items else self._exclusive
        if all(item.ref.kind not in LINED for item in items) or all(item.ref.kind in EXCLUSIVE for item in items):
            return await first.renew(items)
        # holds of several kinds: each queue renews its own (a candidate's hold as the scripts know it)
        groups: dict[ExclusiveLock | QueuedResource, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(self._queue(item.ref), []).append(index)
        results: list[bool | BaseException] = [False] * len(items)
        for queue, indexes in groups.items():
            group = [items[i] for i in indexes]
            if queue is self._elections.lock:
                group = [RenewItem(item.ref, self._hold(item.ref, item.hold), item.ttl) for item in group]
            for index, answer in zip(indexes, await queue.renew(group), strict=True):
                results[index] = answer
        return results

    async def info(self, ref: LockRef) -> LockInfo:
        info = await self._queue(ref).info(ref)
        if ref.kind != "election" or info.owner is None:
            return info
        owner = hold_of(info.owner)[0]  # (the hold id: the front tells the identity)
        return dataclasses.replace(info, owner=owner, holders=(owner,))

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Release the holder's hold by its identity, as its own release would (``backends/_breaking.py``)."""
        return await break_by_release(self, ref, owner)

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: its identity and token, in one read (``since`` is None)."""
        found = await self._elections.leader(ref)
        return None if found is None else found[0]

    def observe(self, ref: LockRef) -> LeaderWatch:
        """The leader after each message of the election's channel (see ``_election.py``)."""
        return RedisLeaderWatch(self._elections, ref)

    async def names(self) -> list[str]:
        """Names of the plain (and fair) locks held under this client's prefix."""
        return await self._exclusive.names()

    async def aclose(self) -> None:
        await self._pubsub.aclose()
        self._holds.clear()
        await self.connection.aclose()
