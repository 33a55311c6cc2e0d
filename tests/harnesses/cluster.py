"""The Redis Cluster harness: a three-primary cluster shared by the session; isolation by prefix.

A hold is lost server-side by deleting its key: the plain lock's hash
``<prefix>:{name}``, an election's string ``<prefix>:{name}:e`` (its line
beside it stays).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

import asynclock
from asynclock.backends.cluster import ClusterBackend
from asynclock.backends.redis._shards import Shard, ShardListener
from tests.harnesses import Harness
from tests.servers.redis_topologies import ClusterSetup


def cluster_backend(locks: asynclock.Locks) -> ClusterBackend:
    backend = locks.backend
    assert isinstance(backend, ClusterBackend)
    return backend


def shard_of(shards: ShardListener, channel: bytes) -> Shard:
    """The node connection of a sharded listener that is subscribed to ``channel``."""
    return next(shard for shard in shards._shards.values() if channel in shard.channels)


def handovers_listening(locks: asynclock.Locks) -> list[str]:
    """The hand-over channels the cluster client is subscribed to now."""
    return cluster_backend(locks)._handovers.listening


class ClusterHarness(Harness):
    kind = "redis+cluster"
    can_pause = True

    def __init__(self, cluster: ClusterSetup) -> None:
        super().__init__()
        self.cluster = cluster
        self.admin = aioredis.RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", s.port) for s in cluster.servers])

    @property
    def url(self) -> str:
        return self.cluster.url

    async def expire(self, name: str) -> bool:
        return bool(await self.admin.delete(f"{self.prefix}:{{{name}}}"))

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Drop an election's leader hold (its line stays), with no message; the plain lock's hash."""
        if kind != "election":
            return await self.expire(name)
        key = f"{self.prefix}:{{{name}}}:e"
        value = await self.admin.get(key)
        return value is not None and b" " in value and bool(await self.admin.delete(key))

    async def keys(self) -> list[str]:
        return [k.decode() async for k in self.admin.scan_iter(match=f"{self.prefix}:*")]

    async def leftovers(self) -> list[str]:
        """Every key of the prefix but what a released lock or election keeps of its fencing
        tokens (``…:fence``; an election's ``…:e`` holding only its last token)."""
        left = []
        for key in await self.keys():
            if key.endswith(":fence"):
                continue
            if key.endswith(":e"):
                value = await self.admin.get(key)
                if value is not None and b" " not in value:
                    continue
            left.append(key)
        return left

    async def close(self) -> None:
        for key in await self.keys():
            await self.admin.delete(key)
        await self.admin.aclose()
