"""The plain lock's uncontended path on one Redis server: the races and faults around it.

An uncontended acquire is one script call that finds the lock free and
takes it; a release is one call that frees it unless somebody is queued.
These tests race that path against a second owner, cancel it at each of its
awaits, and restart the server between an acquire and its release.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import LockTimeout, NotHeld
from tests.harnesses import RedisHarness
from tests.servers import RedisServer, scaled
from tests.test_primitives import queued

pytestmark = pytest.mark.anyio

#: Long: a lock that comes free within a test was released, never expired.
LONG = scaled(30.0)


@pytest.fixture
async def shared(redis_server: RedisServer) -> AsyncIterator[RedisHarness]:
    async with RedisHarness(redis_server) as h:
        yield h


# -- a second owner arriving ---------------------------------------------------------


async def test_owners_arriving_together_at_a_free_lock_get_it_one_at_a_time_in_token_order(
    shared: RedisHarness,
) -> None:
    """Four clients ask for a free lock at the same moment, again and again: one
    takes it at once, the others queue in the same request and are handed it
    one after the other; never two holders, tokens always increasing."""
    clients = [shared.connect(ttl=LONG) for _ in range(4)]
    holding: list[int] = []
    tokens: list[int] = []

    async def use(client: asynclock.Locks) -> None:
        async with client.lock("race") as lease:
            assert lease.token is not None
            holding.append(1)
            assert len(holding) == 1, "two holders at once"
            tokens.append(lease.token)
            await asyncio.sleep(0)
            holding.pop()

    for _ in range(25):
        async with asyncio.timeout(scaled(10)):
            await asyncio.gather(*(use(client) for client in clients))
    assert len(tokens) == 100 and tokens == sorted(tokens) and len(set(tokens)) == 100


async def test_a_release_racing_a_new_acquire_hands_over_to_the_queued_waiter(shared: RedisHarness) -> None:
    """A holder releases while a newcomer tries to take the lock (``timeout=0``,
    which never queues) and another owner waits in the queue: the waiter gets
    it, every time; the newcomer never jumps the queue."""
    holder, waiter, newcomer = (shared.connect(ttl=LONG) for _ in range(3))
    lock = holder.lock("jump")
    for _ in range(30):
        held = await lock.acquire(detached=True)
        waiting = asyncio.create_task(waiter.lock("jump").acquire(detached=True))
        await queued(lock, 1)
        released, jumped = await asyncio.gather(
            held.release(), newcomer.lock("jump").acquire(timeout=0), return_exceptions=True
        )
        assert released is None
        assert isinstance(jumped, LockTimeout), f"the newcomer jumped the queue: {jumped!r}"
        lease = await asyncio.wait_for(waiting, scaled(5))
        assert lease.token is not None
        await lease.release()


# -- cancelled at each await ---------------------------------------------------------


class Gate:
    """Stops the task under test inside one await of the hot path's connections until it is cancelled there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.reached = asyncio.Event()
        self.passed = 0
        connection_class: Any = aioredis.Connection
        real = getattr(connection_class, method)
        gate = self

        async def gated(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if asyncio.current_task() is gate.task and not gate.reached.is_set():
                gate.reached.set()
                await asyncio.sleep(3600)  # cancelled here
            return await real(conn, *args, **kwargs)

        monkeypatch.setattr(connection_class, method, gated)


@contextlib.contextmanager
def _gated(monkeypatch: pytest.MonkeyPatch, method: str) -> Iterator[Gate]:
    with monkeypatch.context() as patch:
        yield Gate(patch, method)


@pytest.mark.parametrize("where", ["connect", "send_packed_command", "read_response"])
async def test_an_acquire_cancelled_at_each_await_leaves_the_lock_free(
    redis_fresh: RedisServer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Cancelled while connecting, while sending its one request, or after the
    server took the lock for it but before the answer was read: the acquire
    raises CancelledError, and the lock is free for another client at once
    (given back by its hold's identity), not after its 30 s ttl."""
    async with RedisHarness(redis_fresh) as harness:
        victim, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
        await victim.lock("warm").acquire()  # (the hand-over channel is subscribed already)
        await victim.lock("warm").release()
        if where == "connect":
            # the server closes the client's connections: the next request connects anew
            await harness.admin.client_kill_filter(_type="normal", skipme=True)
            await asyncio.sleep(0.05)
        lock = victim.lock("cancelled")
        with _gated(monkeypatch, where) as gate:
            gate.task = asyncio.create_task(lock.acquire())
            await asyncio.wait_for(gate.reached.wait(), scaled(5))
            if where == "read_response":
                # the request went out: the server has taken the lock for the victim
                async with asyncio.timeout(scaled(5)):
                    while (await lock.info()).owner is None:
                        await asyncio.sleep(0.005)
            gate.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gate.task
        assert not lock.held
        lease = await other.lock("cancelled").acquire(timeout=scaled(2))
        assert lease.token is not None
        await other.lock("cancelled").release()


@pytest.mark.parametrize("where", ["send_packed_command", "read_response"])
async def test_a_release_cancelled_at_each_await_still_frees_the_lock(
    redis_fresh: RedisServer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The releasing task is cancelled inside the release request: the lock is
    released all the same (in the background), soon, not after its ttl."""
    async with RedisHarness(redis_fresh) as harness:
        victim, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
        lock = victim.lock("released")

        async def hold_then_release() -> None:
            await lock.acquire()
            gate.task = asyncio.current_task()
            await lock.release()

        with _gated(monkeypatch, where) as gate:
            task = asyncio.create_task(hold_then_release())
            await asyncio.wait_for(gate.reached.wait(), scaled(5))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        lease = await other.lock("released").acquire(timeout=scaled(2))
        assert lease.token is not None
        await other.lock("released").release()


# -- the server restarts between acquire and release --------------------------------


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    """A redis-server that keeps its data across a restart (append-only file, synced at once)."""
    server = RedisServer(extra=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    yield server
    server.cleanup()


async def test_a_restart_that_keeps_the_data_keeps_the_hold_and_its_release_works(durable: RedisServer) -> None:
    async with asynclock.connect(durable.url, ttl=LONG) as locks, asynclock.connect(durable.url, ttl=LONG) as other:
        lock = locks.lock("kept")
        lease = await lock.acquire()
        durable.stop()
        durable.start()
        with pytest.raises(LockTimeout):  # still held after the restart
            await other.lock("kept").acquire(timeout=0)
        await lock.release()  # on a new connection: the old one died with the server
        assert not lease.lost
        again = await other.lock("kept").acquire(timeout=scaled(2))
        assert lease.token is not None and again.token is not None and again.token > lease.token
        await other.lock("kept").release()


async def test_a_release_after_a_restart_without_the_data_leaves_the_next_holder_alone(
    redis_fresh: RedisServer,
) -> None:
    """The hold vanished with the data and another client took the lock: the old
    holder's release (its token known to its client) must not free the new
    holder's lock, and the new holder's token is higher all the same."""
    async with (
        asynclock.connect(redis_fresh.url, ttl=LONG) as old,
        asynclock.connect(redis_fresh.url, ttl=LONG) as new,
        asynclock.connect(redis_fresh.url, ttl=LONG) as third,
    ):
        lease = await old.lock("gone").acquire()
        redis_fresh.restart_empty()
        taken = await new.lock("gone").acquire(timeout=scaled(5))
        assert lease.token is not None and taken.token is not None and taken.token > lease.token
        # (NotHeld, or nothing if its first try failed on the connection the restart
        # closed: then "not the holder" may mean that try went through)
        with contextlib.suppress(NotHeld):
            await old.lock("gone").release()
        with pytest.raises(LockTimeout):
            await third.lock("gone").acquire(timeout=0)
        info = await third.lock("gone").info()
        assert info.owner is not None and info.owner.startswith(new.client_id)
        assert not taken.lost
        await new.lock("gone").release()
