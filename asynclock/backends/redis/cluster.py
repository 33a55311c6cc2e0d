"""Redis Cluster (``redis+cluster://h1:p1,h2:p2,…`` or a ``redis.asyncio.RedisCluster``).

The hash lock (``_hash.py``) on a cluster client: every key of one lock
(hash, fence counter, release channel) carries the ``{name}`` hash tag, so
each script touches one slot and the cluster client routes it (following
MOVED and ASK when a slot migrates).

Leader elections are the single server's (``_election.py``: the exclusive
lock's FIFO line under ``<prefix>:{name}:e``), with every channel in the
election's slot too: the scripts SPUBLISH the leader on the shard channel
``<prefix>:{name}:e`` and a hand-over on ``<prefix>:{name}:e:w:<client
id>``, which a client subscribes on the slot's node while one of its
candidates waits in that line. The fair lock, the read-write lock and the
semaphore are not offered here.

* Renewals are grouped by slot: one script call per slot in use, sent to
  the slots' nodes in parallel (a script may not touch keys of two slots).
* Releases are announced on the lock's shard channel, and waiters listen on
  the node that serves that channel's slot (``_shards.py``); after a gap in
  a subscription (a moved slot, a failover, a lost connection) every waiter
  and candidate looks again, and every observer reads again.

A hold lives on the primary that serves its slot. Cluster failover has the
same hole as Sentinel: a replica promoted before it received the acquire does
not have the key; the holder learns it at its next renewal (loss, never a
silent continuation), but another client may have taken the lock by then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

try:
    from redis import exceptions as redis_errors
    from redis._parsers import AsyncCommandsParser
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis Cluster backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._errors import BackendUnavailable
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, credentials, host_list, mask_text, mask_url
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem, unsupported
from .._breaking import break_by_release
from ._connection import GIVEN_CLIENT_HINT, Connection, password_hint
from ._election import Elections, RedisLeaderWatch, hold_of, server_hold
from ._exclusive import ExclusiveLock
from ._hash import HashLock
from ._queue import QueueClient
from ._shards import UNAVAILABLE, ShardHandovers, ShardListener
from ._urls import accepted, check_options, database, url_value

__all__ = ["ClusterBackend"]

#: Options of redis-py's RedisCluster that the URL (or asynclock) sets itself.
_FROM_URL = ("host", "port", "startup_nodes", "path")


def cluster_options() -> dict[str, Any]:
    """What ``redis.asyncio.RedisCluster`` takes, keyword or URL parameter (the nodes come from the URL)."""
    found = accepted(RedisCluster)
    for ours in _FROM_URL:
        found.pop(ours, None)
    return found


class _AnyPrimaryParser(AsyncCommandsParser):
    """Reads the command table from any primary that answers.

    redis-py asks only the first primary it knows for COMMAND while it maps
    the cluster; when that node is down, every request fails, even those for
    slots that live primaries serve.
    """

    __slots__ = ("_cluster",)

    def __init__(self, cluster: RedisCluster) -> None:
        super().__init__()
        self._cluster = cluster

    async def initialize(self, node: ClusterNode | None = None) -> None:
        first = node if node is not None else getattr(self, "node", None)
        candidates = [first, *(primary for primary in self._cluster.get_primaries() if primary is not first)]
        failure: BaseException | None = None
        for candidate in candidates:
            if candidate is None:
                continue
            try:
                await super().initialize(candidate)
                return
            except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
                failure = exc
        raise failure or redis_errors.ConnectionError("no primary answered COMMAND")


class ClusterBackend:
    """Locks and leader elections on a Redis Cluster.

    Example::

        async with asynclock.connect("redis+cluster://n1:7000,n2:7001,n3:7002") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    scheme = "redis+cluster"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["redis+cluster"].words

    def __init__(
        self,
        client: RedisCluster,
        *,
        prefix: str = "asynclock",
        owns_client: bool = False,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        hint: str = GIVEN_CLIENT_HINT,
    ) -> None:
        nodes = ",".join(node.name for node in client.startup_nodes)
        #: The cluster client, its errors (its own among them) and its scripts.
        self.connection = Connection(
            client,
            where=f"Redis Cluster at {nodes}",
            connect_timeout=connect_timeout,
            secrets=[client.nodes_manager.connection_kwargs.get("password")],
            unavailable=UNAVAILABLE,
            owns_client=owns_client,
            hint=hint,
        )
        self._cluster = client
        self._hash = HashLock(self.connection, prefix, sharded=True)
        self._shards: ShardListener | None = None
        # elections: the candidates' line, and this client's holds that wait in one
        self._line = ExclusiveLock(
            self.connection, prefix, secrets.token_hex(8), suffix="e", announces=True, sharded=True
        )
        self._elections: Elections | None = None
        # this client's side of the elections' lines: acquires, waits for a hand-over, polls, leaves
        self._handovers = ShardHandovers(self.connection, self._line.handover_channel)
        self._candidates = QueueClient(self.connection, self._handovers)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> ClusterBackend:
        """``redis+cluster://[:password@]h1:p1,h2:p2,…[?option=…]``: any reachable nodes of the cluster.

        Query parameters and ``options`` go to ``redis.asyncio.RedisCluster``;
        one it does not take raises ValueError (naming the closest valid one)
        before any I/O.
        """
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        nodes = [ClusterNode(host, port) for host, port in host_list(hosts, url, "a Redis Cluster URL names its nodes")]
        if database(parts.path, url):
            raise ValueError(f"Redis Cluster has only database 0, got {mask_url(url)}")
        valid = cluster_options()
        check_options(
            url,
            options,
            (),
            "redis+cluster://",
            passed_on=valid,
            others="and what redis-py's RedisCluster takes, such as read_from_replicas, socket_timeout or password",
        )
        kwargs: dict[str, Any] = {
            key: url_value(key, value, valid.get(key)) for key, value in parse_qsl(parts.query, keep_blank_values=True)
        }
        kwargs.update(credentials(userinfo))
        kwargs.update(options)
        kwargs.setdefault("socket_connect_timeout", connect_timeout)
        # Fail fast on a dead node (the front retries requests itself): a
        # client that retries with backoff holds its topology refresh, and so
        # every other slot's requests, for a second per failed request.
        kwargs.setdefault("retry", Retry(NoBackoff(), 1))
        try:
            client = RedisCluster(startup_nodes=nodes, **kwargs)
        except redis_errors.RedisClusterException as exc:  # a bad option (no I/O yet)
            raise ValueError(mask_text(str(exc), [kwargs.get("password")])) from None
        client.commands_parser = _AnyPrimaryParser(client)
        return cls(
            client,
            prefix=prefix,
            owns_client=True,
            connect_timeout=connect_timeout,
            hint=password_hint("redis+cluster", hosts),
        )

    @classmethod
    def from_client(
        cls,
        client: RedisCluster,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> ClusterBackend:
        """A backend on a cluster client the caller made (and closes); it takes no options."""
        check_options("", options, (), "a redis.asyncio.RedisCluster client")
        return cls(client, prefix=prefix, owns_client=False, connect_timeout=connect_timeout)

    @property
    def where(self) -> str:
        """The cluster, as messages name it."""
        return self.connection.where

    @property
    def cluster(self) -> RedisCluster:
        return self._cluster

    @property
    def shards(self) -> ShardListener | None:
        """The sharded pub/sub listener (for tests)."""
        return self._shards

    def channel(self, name: str) -> str:
        """Where releases of ``name`` are announced (its shard channel)."""
        return self._hash.channel(name)

    def handover_channel(self, name: str) -> str:
        """Where this client hears that the election ``name`` was handed to one of its
        candidates (a shard channel in the election's slot)."""
        return self._line.handover_channel(name)

    # -- the request protocol ----------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """The plain lock and leader elections."""
        if kind not in ("lock", "election"):
            raise unsupported(
                self.scheme,
                kind,
                "use a single Redis server (redis://) or Sentinel (redis+sentinel://) for the fair lock, "
                "read-write lock and semaphore",
            )

    def lock_key(self, ref: LockRef) -> str:
        return self._line.key(ref.name) if ref.kind == "election" else self._hash.key(ref.name)

    def lease_time(self, ttl: float) -> float:
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._shards = self._handovers.shards = ShardListener(self.connection, hooks, self._hash.channel)
        self._elections = Elections(self._line, self._shards)

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        """The plain lock: take it or re-enter it; Busy (with the holder's remaining lease) if
        taken, and waiters are woken by releases. A candidate: lead, or join the line (Queued)."""
        if self._shards is not None:
            self._shards.note_ttl(ttl)
        if ref.kind == "election":
            hold = server_hold(hold, ref.identity)
            return await self._candidates.try_acquire(self._line, ref, hold, ttl, enqueue=enqueue)
        return await self._hash.try_acquire(ref.name, hold, ttl)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """A candidate in line: until its hand-over message arrives or the loop time ``until``;
        then one poll (``_queue.py``)."""
        return await self._candidates.wait_queued(self._line, ref, server_hold(hold, ref.identity), ttl, until)

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        if ref.kind == "election":
            return await self._line.set_count(ref, server_hold(hold, ref.identity), count, ttl)
        return await self._hash.set_count(ref.name, hold, count, ttl)

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Release ``hold``; a candidate also leaves the line (and gives back a hand-over that raced in)."""
        if ref.kind != "election":
            return await self._hash.release(ref.name, hold)
        hold = server_hold(hold, ref.identity)
        return await self._line.release(ref, hold, self._candidates.leave(ref, hold))

    async def info(self, ref: LockRef) -> LockInfo:
        if ref.kind != "election":
            return await self._hash.info(ref.name)
        info = await self._line.info(ref)
        if info.owner is None:
            return info
        owner = hold_of(info.owner)[0]  # (the hold id: the front tells the identity)
        return dataclasses.replace(info, owner=owner, holders=(owner,))

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Release the holder's hold by its identity, as its own release would (``backends/_breaking.py``)."""
        return await break_by_release(self, ref, owner)

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: its identity and token, in one read (``since`` is None)."""
        if self._elections is None:
            raise BackendUnavailable("the Redis Cluster backend is closed")
        found = await self._elections.leader(ref)
        return None if found is None else found[0]

    def observe(self, ref: LockRef) -> LeaderWatch:
        """The leader after each message of the election's shard channel, each resubscription of
        it, and each expiry of the leader's hold (see ``_election.py``)."""
        if self._elections is None:
            raise BackendUnavailable("the Redis Cluster backend is closed")
        return RedisLeaderWatch(self._elections, ref)

    async def names(self) -> list[str]:
        """Names of the locks held under this client's prefix, on every primary."""
        return await self._hash.names()

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One script call per slot (and kind: locks, candidates), all in parallel, each bounded on its own."""
        groups: dict[tuple[bool, int], list[int]] = {}
        for index, item in enumerate(items):
            elected = item.ref.kind == "election"
            key = self._line.key(item.name) if elected else self._hash.key(item.name)
            groups.setdefault((elected, self._cluster.keyslot(key)), []).append(index)

        async def renew_slot(elected: bool, indexes: list[int]) -> list[bool | BaseException]:
            group = [items[i] for i in indexes]
            try:
                # A slot whose node is gone must not hold up the other slots'
                # answers past their leases: each group gets a quarter of its
                # shortest ttl (renewals start a third into the lease).
                async with asyncio.timeout(min(item.ttl for item in group) / 4):
                    if elected:  # (a candidate's hold as the scripts know it)
                        group = [RenewItem(i.ref, server_hold(i.hold, i.ref.identity), i.ttl) for i in group]
                        return await self._line.renew(group)
                    return await self._hash.renew(group)
            except TimeoutError as exc:
                return [self.connection.error(exc)] * len(indexes)

        answers = await asyncio.gather(*(renew_slot(elected, indexes) for (elected, _), indexes in groups.items()))
        results: list[bool | BaseException] = [False] * len(items)
        for indexes, answer in zip(groups.values(), answers, strict=True):
            for index, result in zip(indexes, answer, strict=True):
                results[index] = result
        return results

    async def subscribe(self, name: str) -> None:
        if self._shards is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the Redis Cluster backend is closed")
        with self.connection.edge:
            await self._shards.subscribe(name)

    async def unsubscribe(self, name: str) -> None:
        if self._shards is not None:
            await self._shards.unsubscribe(name)

    async def aclose(self) -> None:
        await self._handovers.aclose()
        self._candidates.clear()
        if self._shards is not None:
            await self._shards.aclose()
            self._shards = self._handovers.shards = None
        await self.connection.aclose()
