"""The Redlock harness for the contract suite (and the Redlock-only tests).

Five independent redis-servers; isolation is by prefix. A hold is lost
server-side the way Redlock loses one: its key disappears from a majority of
the nodes (here from every node, as an expiry would do it).
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis

import asynclock
from asynclock.backends.redlock import RedlockBackend
from tests.harnesses import Harness
from tests.servers.redis_topologies import RedisNodes


def redlock_backend(locks: asynclock.Locks) -> RedlockBackend:
    backend = locks.backend
    assert isinstance(backend, RedlockBackend)
    return backend


def spy_releases(backend: RedlockBackend, record: Callable[[str, bytes], None]) -> None:
    """Call ``record(name, hold)`` on every release message the client hears, before it acts on it."""
    releases = backend._releases
    assert releases is not None
    wake = releases.wake
    real = wake.released

    def released(name: str, hold: bytes) -> None:
        record(name, hold)
        real(name, hold)

    wake.released = released  # type: ignore[method-assign]


class RedlockHarness(Harness):
    kind = "redlock"
    can_pause = True
    #: Redlock gives no fencing tokens (lease.token is None)
    has_tokens = False

    def __init__(self, nodes: RedisNodes) -> None:
        super().__init__()
        self.nodes = nodes
        self.admins = [aioredis.Redis.from_url(server.url) for server in nodes.servers]

    @property
    def url(self) -> str:
        return self.nodes.url

    async def expire(self, name: str) -> bool:
        key = f"{self.prefix}:{{{name}}}"
        deleted = [await admin.delete(key) for admin in self.admins]
        return sum(deleted) >= len(self.admins) // 2 + 1

    async def keys(self, admin: aioredis.Redis) -> list[str]:
        return [k.decode() async for k in admin.scan_iter(match=f"{self.prefix}:*")]

    async def leftovers(self) -> list[str]:
        left = []
        for index, admin in enumerate(self.admins):
            if not self.nodes[index].running:
                continue
            left += [f"node{index}:{key}" for key in await self.keys(admin) if not key.endswith(":fence")]
        return left

    async def close(self) -> None:
        for index, admin in enumerate(self.admins):
            if self.nodes[index].running:
                keys = await self.keys(admin)
                if keys:
                    await admin.delete(*keys)
            await admin.aclose()
