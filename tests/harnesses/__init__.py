"""Per-backend test harnesses: connect, inject faults, check hygiene."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis

import asynclock
from asynclock.backends import memory
from asynclock.backends.redis import RedisBackend
from asynclock.backends.redis._connection import Connection
from asynclock.backends.redis._exclusive import ExclusiveLock
from asynclock.backends.redis._pubsub import OnMessage, OnResync, PubSub
from asynclock.backends.redis._shards import Shard
from asynclock.backends.redis._shared import QueuedResource
from asynclock.testing import conformance
from tests.servers import RedisServer


class Harness(conformance.Harness):
    """What the project's tests need from a backend: the conformance suite's
    harness, plus the faults and the primitives the backend-specific tests use."""

    kind = "?"
    #: whether killing the server / its connections is possible
    can_pause = False

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Like ``expire`` for the primitive ``kind`` ("fair", "write", "semaphore") of ``name``."""
        raise NotImplementedError


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
        tokens: a lock or election held or queued for (``<prefix>:{name}:x`` or
        ``…:e`` holding a hold, ``…:x:q``, ``…:e:q``), and the read-write lock's
        and semaphore's holds, queues and waiting entries
        (``<prefix>:{name}:rw|sem[:data|:queue|:waiting]``)."""
        keys = [k.decode() async for k in self.admin.scan_iter(match=f"{self.prefix}:*")]
        left = []
        for key in keys:
            if key.endswith(":fence"):
                continue
            if key.endswith((":x", ":e")):
                value = await self.admin.get(key)
                if value is not None and b" " not in value:  # free: only the last token
                    continue
            left.append(key)
        return left

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Drop every hold of the primitive ``kind`` of ``name`` (its queue stays), with no message."""
        if kind in ("lock", "fair", "election"):
            key = f"{self.prefix}:{{{name}}}:{'e' if kind == 'election' else 'x'}"
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


def redis_listener(locks: asynclock.Locks) -> PubSub:
    """The Redis client's pub/sub connection, shared by all its listeners."""
    return redis_backend(locks)._pubsub


def handover_channel(locks: asynclock.Locks) -> bytes:
    """The channel on which the Redis client hears of hand-overs to its waiters."""
    return redis_backend(locks)._handovers.channel.encode()


def redis_exclusive(locks: asynclock.Locks) -> ExclusiveLock:
    """The Redis client's queue of plain fair locks."""
    return redis_backend(locks)._exclusive


def redis_shared(locks: asynclock.Locks) -> QueuedResource:
    """The Redis client's queue of shared locks (read-write locks and semaphores)."""
    return redis_backend(locks)._shared


def route(listener: PubSub, channel: bytes) -> tuple[OnMessage, OnResync]:
    """What a pub/sub listener calls on a message of ``channel``, and after it subscribed again."""
    return listener._routes[channel]


def set_route(listener: PubSub, channel: bytes, on_message: OnMessage, on_resync: OnResync) -> None:
    """Make a pub/sub listener call these on ``channel`` instead (as a fault or a spy)."""
    listener._routes[channel] = (on_message, on_resync)


def routed(listener: PubSub, channel: bytes) -> bool:
    """Whether a pub/sub listener still delivers the messages of ``channel``."""
    return channel in listener._routes


def has_connection(listener: PubSub | Shard) -> bool:
    """Whether a pub/sub listener (or a cluster shard's) holds a connection now."""
    return listener._conn is not None


def listening(listener: PubSub | Shard) -> bool:
    """Whether a pub/sub listener (or a cluster shard's) is connected and subscribed now."""
    return listener._connected.is_set()


def listener_port(listener: PubSub | Shard) -> int:
    """The local port of a pub/sub listener's (or a cluster shard's) current connection."""
    conn = listener._conn
    assert conn is not None, "the listener is not connected"
    port: int = conn._writer.get_extra_info("sockname")[1]
    return port


def add_idle_connection(connection: Connection, conn: Any) -> None:
    """Put ``conn`` among the idle connections the client's next request takes from."""
    lanes: Any = connection._lanes
    lanes._free.append(conn)
    lanes._open += 1


def drop_memory_holder(prefix: str, kind: str, name: str, hold: str) -> None:
    """Remove the hold ``hold`` from the memory backend's resource, as an expiry would (no notice)."""
    key = memory._queue_key(prefix, kind, name)
    with memory._QUEUES._mutex:
        del memory._QUEUES._resources[key].holders[hold]


@contextlib.contextmanager
def handovers_dropped(locks: asynclock.Locks) -> Iterator[list[bytes]]:
    """Hand-over messages to the Redis client ``locks`` vanish (as if published
    while it reconnected) until the block ends; yields the list of those dropped."""
    pubsub = redis_listener(locks)
    channel = handover_channel(locks)
    dropped: list[bytes] = []
    on_message, on_resync = route(pubsub, channel)
    set_route(pubsub, channel, dropped.append, on_resync)
    try:
        yield dropped
    finally:
        set_route(pubsub, channel, on_message, on_resync)


async def eventually(predicate: Any, timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until ``predicate()`` is true (test helper; never used by the library)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
