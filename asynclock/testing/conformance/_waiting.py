"""The contract of contention: one holder at a time, waiters served in turn with increasing tokens, timeouts."""

from __future__ import annotations

import asyncio

import pytest

import asynclock
from asynclock import LockTimeout

from ._harness import TTL, Harness, has_tokens, scaled

__all__ = ["Waiting"]


class Waiting:
    """Contention: other tasks and other clients wait their turn, and a timeout bounds the wait."""

    async def test_other_task_waits_and_gets_a_higher_token(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("handoff")
        first = await lock.acquire()
        got = asyncio.Event()
        tokens: list[int | None] = []

        async def other() -> None:
            async with lock as lease:
                tokens.append(lease.token)
                got.set()

        task = asyncio.create_task(other())
        await asyncio.sleep(0.05)
        assert not got.is_set(), "another task of the same process must wait"
        await lock.release()
        await asyncio.wait_for(task, scaled(5))
        if has_tokens(harness):
            assert first.token is not None and tokens[0] is not None and tokens[0] > first.token

    async def test_two_clients_exclude_each_other_with_increasing_tokens(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        inside = 0
        tokens: list[int | None] = []

        async def worker(locks: asynclock.Locks) -> None:
            nonlocal inside
            for _ in range(6):
                async with locks.lock("shared") as lease:
                    inside += 1
                    assert inside == 1, "two holders at once"
                    assert (lease.token is not None) == has_tokens(harness)
                    tokens.append(lease.token)
                    await asyncio.sleep(0.002)
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(worker(a), worker(b), worker(a), worker(b)), scaled(20))
        assert len(tokens) == 24
        if has_tokens(harness):
            numbers = [token for token in tokens if token is not None]
            assert numbers == sorted(numbers) and len(set(numbers)) == len(tokens)

    async def test_timeout_zero_tries_once_and_timeout_bounds_the_wait(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        async with a.lock("busy"):
            with pytest.raises(LockTimeout) as caught:
                await b.lock("busy").acquire(timeout=0)
            assert isinstance(caught.value, TimeoutError)
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(LockTimeout):
                await b.lock("busy").acquire(timeout=0.3)
            assert loop.time() - start >= 0.29
            assert not b.lock("busy").held

    async def test_many_waiters_all_get_it_one_at_a_time(self, harness: Harness) -> None:
        clients = [harness.connect(ttl=TTL) for _ in range(3)]
        inside = 0
        done = 0

        async def worker(locks: asynclock.Locks) -> None:
            nonlocal inside, done
            for _ in range(4):
                async with locks.lock("crowd"):
                    inside += 1
                    assert inside == 1
                    await asyncio.sleep(0.001)
                    inside -= 1
                    done += 1

        await asyncio.wait_for(asyncio.gather(*(worker(clients[i % 3]) for i in range(9))), scaled(30))
        assert done == 36

    async def test_timeout_via_asyncio_timeout_keeps_the_owner(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("own")
        async with asyncio.timeout(scaled(5)):
            await lock.acquire()
        assert lock.held
        await lock.release()
