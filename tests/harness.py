"""Per-backend test harnesses: connect, inject faults, check hygiene."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis

import asynclock
from asynclock.backends import memory
from asynclock.backends.redis import RedisBackend
from tests.servers import RedisServer


class Harness:
    """What the contract suite needs from a backend."""

    kind = "?"
    #: whether killing the server / its connections is possible
    can_pause = False
    #: whether the server keeps the hold count (info().hold_count of a re-entered lock)
    server_counts = True

    def __init__(self) -> None:
        self.prefix = f"t{secrets.token_hex(4)}"
        self._clients: list[asynclock.Locks] = []

    @property
    def url(self) -> str:
        raise NotImplementedError

    def connect(self, **options: Any) -> asynclock.Locks:
        options.setdefault("prefix", self.prefix)
        locks = asynclock.connect(self.url, **options)
        self._clients.append(locks)
        return locks

    async def expire(self, name: str) -> bool:
        """Remove the hold on ``name`` server-side, as an expiry would (no notification)."""
        raise NotImplementedError

    async def leftovers(self) -> list[str]:
        """Keys (or nodes) of this test's prefix still present, fence counters aside.

        Includes what the fair lock, read-write lock and semaphore leave.
        """
        raise NotImplementedError

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Like ``expire`` for the primitive ``kind`` ("fair", "write", "semaphore") of ``name``."""
        raise NotImplementedError

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for locks in self._clients:
            await locks.aclose()
        if exc_type is None:
            left = await self.leftovers()
            assert not left, f"test left locks behind: {left}"
        await self.close()

    async def close(self) -> None:
        pass


class MemoryHarness(Harness):
    kind = "memory"

    @property
    def url(self) -> str:
        return "memory://"

    async def expire(self, name: str) -> bool:
        return memory.expire(name, prefix=self.prefix)

    async def leftovers(self) -> list[str]:
        held = memory._TABLE.held_keys() + memory._QUEUES.held_keys()
        return [key for key in held if key.startswith(self.prefix + ":")]

    async def expire_shape(self, kind: str, name: str) -> bool:
        table = "rw" if kind in ("read", "write") else kind
        return memory._QUEUES.expire(memory._queue_key(self.prefix, table, name))


class RedisHarness(Harness):
    kind = "redis"
    can_pause = True

    def __init__(self, server: RedisServer) -> None:
        super().__init__()
        self.server = server
        self.admin = aioredis.Redis.from_url(server.url)

    @property
    def url(self) -> str:
        return self.server.url

    async def expire(self, name: str) -> bool:
        # The plain lock (and the fair lock) is the string ``<prefix>:{name}:x``
        # while held; its queue beside it stays.
        return await self.expire_shape("fair", name)

    async def leftovers(self) -> list[str]:
        """Every key of the prefix but what a released lock keeps of its fencing
        tokens: a lock held or queued for (``<prefix>:{name}:x`` holding a hold,
        ``…:x:q``), and the read-write lock's and semaphore's holds, queues and
        waiting entries (``<prefix>:{name}:rw|sem[:data|:queue|:waiting]``)."""
        keys = [k.decode() async for k in self.admin.scan_iter(match=f"{self.prefix}:*")]
        left = []
        for key in keys:
            if key.endswith(":fence"):
                continue
            if key.endswith(":x"):
                value = await self.admin.get(key)
                if value is not None and b" " not in value:  # free: only the last token
                    continue
            left.append(key)
        return left

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Drop every hold of the primitive ``kind`` of ``name`` (its queue stays), with no message."""
        if kind in ("lock", "fair"):
            key = f"{self.prefix}:{{{name}}}:x"
            value = await self.admin.get(key)
            return value is not None and b" " in value and bool(await self.admin.delete(key))
        family = {"read": "rw", "write": "rw", "semaphore": "sem"}[kind]
        base = f"{self.prefix}:{{{name}}}:{family}"
        return bool(await self.admin.delete(base, f"{base}:data"))

    async def close(self) -> None:
        keys = [k async for k in self.admin.scan_iter(match=f"{self.prefix}:*")]
        if keys:
            await self.admin.delete(*keys)
        await self.admin.aclose()


def redis_backend(locks: asynclock.Locks) -> RedisBackend:
    backend = locks.backend
    assert isinstance(backend, RedisBackend)
    return backend


@contextlib.contextmanager
def handovers_dropped(locks: asynclock.Locks) -> Iterator[list[bytes]]:
    """Hand-over messages to the Redis client ``locks`` vanish (as if published
    while it reconnected) until the block ends; yields the list of those dropped."""
    backend = redis_backend(locks)
    pubsub = backend._pubsub
    channel = backend._handovers.channel.encode()
    dropped: list[bytes] = []
    real = pubsub._routes[channel]
    pubsub._routes[channel] = (dropped.append, real[1])
    try:
        yield dropped
    finally:
        pubsub._routes[channel] = real


async def eventually(predicate: Any, timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until ``predicate()`` is true (test helper; never used by the library)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
