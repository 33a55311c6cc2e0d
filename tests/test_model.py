"""A model of one lock, checked step by step against a real backend.

Hypothesis drives three owners (tasks) on two clients through acquire
(try-once), re-entry, release by owner and non-owner, server-side expiry,
and connection faults; after every step the server's view (``info``), each
owner's ``held`` and the tokens must match the model.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import asynclock
from asynclock.backends import memory
from tests.servers import RedisServer, scaled

NAME = "model"
ACTORS = 3


class _Actor:
    """A task that owns locks and runs the commands it is sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]] = asyncio.Queue()
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            func, future = await self.queue.get()
            try:
                future.set_result(await func())
            except Exception as exc:  # noqa: BLE001 - handed to the test
                future.set_exception(exc)


class LockModel(RuleBasedStateMachine):
    url = "memory://"
    redis_url: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.prefix = f"m{secrets.token_hex(4)}"
        ttl = scaled(2.0)
        self.clients = [asynclock.connect(self.url, ttl=ttl, prefix=self.prefix) for _ in range(2)]
        self.actors = [self.loop.run_until_complete(self._spawn()) for _ in range(ACTORS)]
        self.client_of = [0, 0, 1]
        self.holder: int | None = None
        self.count = 0
        self.tokens: list[int] = []
        self.leases: dict[int, asynclock.Lease] = {}
        self.admin = aioredis.Redis.from_url(self.redis_url) if self.redis_url else None

    async def _spawn(self) -> _Actor:
        return _Actor(asyncio.get_running_loop())

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, scaled(10)))

    def on(self, actor: int, func: Callable[[], Awaitable[Any]]) -> Any:
        async def send() -> Any:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            await self.actors[actor].queue.put((func, future))
            return await future

        return self.run(send())

    def lock(self, actor: int) -> asynclock.Lock:
        return self.clients[self.client_of[actor]].lock(NAME)

    @rule(actor=st.integers(0, ACTORS - 1))
    def acquire(self, actor: int) -> None:
        lock = self.lock(actor)
        if self.holder in (None, actor):
            lease = self.on(actor, lambda: lock.acquire(timeout=0))
            if self.holder is None:
                assert lease.token is not None
                assert not self.tokens or lease.token > self.tokens[-1], "token went backwards"
                self.tokens.append(lease.token)
                self.leases[actor] = lease
            else:
                assert lease is self.leases[actor]
            self.holder, self.count = actor, self.count + 1
            assert lease.hold_count == self.count
        else:
            try:
                self.on(actor, lambda: lock.acquire(timeout=0))
            except asynclock.LockTimeout:
                pass
            else:
                raise AssertionError("acquired a lock held by another owner")

    @rule(actor=st.integers(0, ACTORS - 1))
    def release(self, actor: int) -> None:
        lock = self.lock(actor)
        if self.holder == actor:
            self.on(actor, lock.release)
            self.count -= 1
            if self.count == 0:
                self.holder = None
                del self.leases[actor]
        else:
            try:
                self.on(actor, lock.release)
            except asynclock.NotHeld:
                pass
            else:
                raise AssertionError("a non-owner release succeeded")

    @rule()
    def expire_server_side(self) -> None:
        if self.holder is None:
            return
        lease = self.leases.pop(self.holder)
        if self.admin is not None:
            self.run(self.admin.delete(f"{self.prefix}:{{{NAME}}}"))
        else:
            assert memory.expire(NAME, prefix=self.prefix)
        self.run(lease.wait_lost())
        self.holder, self.count = None, 0

    @rule()
    def drop_connections_and_scripts(self) -> None:
        if self.admin is None:
            return
        self.run(self.admin.script_flush())
        self.run(self.admin.client_kill_filter(_type="normal", skipme=True))
        self.run(self.admin.client_kill_filter(_type="pubsub"))

    @invariant()
    def server_matches_model(self) -> None:
        info = self.run(self.clients[0].lock(NAME).info())
        if self.holder is None:
            assert info.owner is None
        else:
            client = self.clients[self.client_of[self.holder]]
            assert info.owner is not None and info.owner.startswith(client.client_id)
            assert info.hold_count == self.count
            assert info.token == self.tokens[-1]
        for actor in range(ACTORS):
            held = self.on(actor, lambda a=actor: _held(self.lock(a)))
            assert held == (self.holder == actor)

    def teardown(self) -> None:
        async def close() -> None:
            for client in self.clients:
                await client.aclose()
            for actor in self.actors:
                actor.task.cancel()
            await asyncio.gather(*(actor.task for actor in self.actors), return_exceptions=True)
            if self.admin is not None:
                left = [k async for k in self.admin.scan_iter(match=f"{self.prefix}:*") if not k.endswith(b":fence")]
                assert left == [], left
                await self.admin.aclose()
            else:
                assert not [k for k in memory._TABLE.held_keys() if k.startswith(self.prefix)]

        try:
            self.loop.run_until_complete(close())
        finally:
            self.loop.close()


async def _held(lock: asynclock.Lock) -> bool:
    return lock.held


MODEL_SETTINGS = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_model_memory() -> None:
    class Memory(LockModel):
        url = "memory://"

    run_state_machine_as_test(Memory, settings=MODEL_SETTINGS)


@pytest.fixture
def model_redis(redis_server: RedisServer) -> RedisServer:
    return redis_server


def test_model_redis(model_redis: RedisServer) -> None:
    class Redis(LockModel):
        url = model_redis.url
        redis_url = model_redis.url

    run_state_machine_as_test(Redis, settings=MODEL_SETTINGS)
