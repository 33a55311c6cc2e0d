"""A model of one lock, checked step by step against a real backend.

Hypothesis drives three owners (tasks) on two clients through acquire
(try-once), re-entry, release by owner and non-owner, server-side expiry,
connection faults, and the crash of the holder's client (it stops renewing
and never releases; the server frees the lock when the lease runs out, which
the model fast-forwards); after every step the server's view (``info``),
each owner's ``held`` and the tokens must match the model. It runs against
memory, Redis, ZooKeeper and PostgreSQL through their test harnesses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import asynclock
from tests.harnesses import Harness, MemoryHarness, RedisHarness, insides
from tests.servers import RedisServer, scaled
from tests.servers.mysql import MariaDBServer
from tests.servers.postgres import PostgresServer
from tests.servers.zookeeper import ZooKeeperServer

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

    def make_harness(self) -> Harness:
        """The backend's test harness: expiry and leftovers (made inside the model's loop)."""
        return MemoryHarness()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.harness = self.loop.run_until_complete(self._make_harness())
        self.prefix = self.harness.prefix
        # An expiry step waits for the holder's watchdog to notice the loss at its next
        # renewal, up to ttl/3 later: that wait is most of this test's time. The
        # loop runs only inside a step, and steps follow each other within
        # milliseconds, far within the 2/3 ttl a renewal may be late by.
        self.ttl = scaled(1.0)
        self.clients = [self.connect() for _ in range(2)]
        self.actors = [self.loop.run_until_complete(self._spawn()) for _ in range(ACTORS)]
        self.client_of = [0, 0, 1]
        self.holder: int | None = None
        self.count = 0
        self.tokens: list[int] = []
        self.leases: dict[int, asynclock.Lease] = {}
        # the harness's own admin connection, so that dropping every other one spares it
        self.admin = self.harness.admin if isinstance(self.harness, RedisHarness) else None

    async def _spawn(self) -> _Actor:
        return _Actor(asyncio.get_running_loop())

    async def _make_harness(self) -> Harness:
        return self.make_harness()

    def connect(self) -> asynclock.Locks:
        # through the harness, so that its leftovers() knows every client
        return self.harness.connect(ttl=self.ttl)

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, scaled(10)))

    def on(self, actor: int, func: Callable[[], Awaitable[Any]]) -> Any:
        async def send() -> Any:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            await self.actors[actor].queue.put((func, future))
            return await future

        return self.run(send())

    def lock(self, actor: int) -> asynclock.Lock:
        return self.handle(self.clients[self.client_of[actor]])

    async def expire_on_server(self) -> bool:
        """Take the hold away on the server, as an expiry would."""
        return await self.harness.expire(NAME)

    def handle(self, client: asynclock.Locks) -> asynclock.Lock:
        """The lock under test, on ``client`` (the fair lock's model makes a fair one)."""
        return client.lock(NAME)

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
        assert self.run(self.expire_on_server())
        self.run(lease.wait_lost())
        self.holder, self.count = None, 0

    @rule()
    def kill_the_holders_client(self) -> None:
        """The holder's client crashes: no more renewals, no release; a new client
        (a restarted process) takes its place for the owners it had."""
        if self.holder is None:
            return
        index = self.client_of[self.holder]
        self.run(_crash(self.clients[index]))
        # The server frees the lock once the lease runs out (ZooKeeper and
        # PostgreSQL at once: the session or connection is gone); fast-forward that.
        self.run(self.expire_on_server())
        self.clients[index] = self.connect()
        for actor, client in enumerate(self.client_of):
            if client == index:
                self.leases.pop(actor, None)
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
        if self.holder is None:
            for client in self.clients:
                assert self.run(self.handle(client).info()).owner is None
        else:
            # asked through the holder's client, which can tell its own hold apart
            client = self.clients[self.client_of[self.holder]]
            info = self.run(self.handle(client).info())
            assert info.owner is not None and info.owner.startswith(client.client_id)
            if self.harness.server_counts:
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
            try:
                left = await self.harness.leftovers()
                assert left == [], left
            finally:
                await self.harness.close()

        try:
            self.loop.run_until_complete(close())
        finally:
            self.loop.close()


async def _held(lock: asynclock.Lock) -> bool:
    return lock.held


async def _crash(locks: asynclock.Locks) -> None:
    """Stop a client as a crash would: its watchdog and connections go, nothing is released."""
    await insides.crash(locks)


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

        def make_harness(self) -> Harness:
            return RedisHarness(model_redis)

    run_state_machine_as_test(Redis, settings=MODEL_SETTINGS)


def test_model_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    from tests.harnesses.zookeeper import ZooKeeperHarness

    class ZooKeeper(LockModel):
        url = zookeeper_server.url

        def make_harness(self) -> Harness:
            return ZooKeeperHarness(zookeeper_server)

    run_state_machine_as_test(ZooKeeper, settings=MODEL_SETTINGS)


def test_model_postgres(postgres_server: PostgresServer) -> None:
    from tests.harnesses.postgres import PostgresHarness

    class Postgres(LockModel):
        url = postgres_server.url

        def make_harness(self) -> Harness:
            return PostgresHarness(postgres_server)

    run_state_machine_as_test(Postgres, settings=MODEL_SETTINGS)


def test_model_mysql(mysql_server: MariaDBServer) -> None:
    from tests.harnesses.mysql import MySQLHarness

    class MySQL(LockModel):
        url = mysql_server.url

        def make_harness(self) -> Harness:
            return MySQLHarness(mysql_server)

    run_state_machine_as_test(MySQL, settings=MODEL_SETTINGS)
