"""The contract of cancellation: an acquire or a release cut short anywhere leaves no hold behind."""

from __future__ import annotations

import asyncio
import random

import pytest

from ._harness import TTL, Harness, has_tokens

__all__ = ["Cancelling"]


class Cancelling:
    """Cancellation: wherever it lands, the lock is free for somebody else at once."""

    async def test_cancelled_waiter_leaves_nothing_behind(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        holder = await a.lock("cw").acquire()
        waiter = asyncio.create_task(b.lock("cw").acquire())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await a.lock("cw").release()
        assert (holder.token is not None) == has_tokens(harness)
        # the cancelled waiter holds nothing: a third party gets it at once
        c = harness.connect(ttl=TTL)
        async with c.lock("cw"):
            pass

    async def test_cancelling_acquire_or_release_at_random_points_never_leaves_a_hold(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        rng = random.Random(1234)
        cancelled = 0
        lock = locks.lock("fuzz")

        async def use() -> None:
            await lock.acquire()
            await lock.release()

        async def hold_briefly(taken: asyncio.Event) -> None:
            async with other.lock("fuzz"):
                taken.set()
                await asyncio.sleep(rng.uniform(0, 0.003))

        for i in range(60):
            blocker = None
            if i % 3 == 0:
                # Taken by another client and let go a moment later: the
                # cancellation lands in the wait, or around the hand-over. (An
                # uncontended in-process acquire and release may never yield.)
                taken = asyncio.Event()
                blocker = asyncio.create_task(hold_briefly(taken))
                await taken.wait()
            task = asyncio.create_task(use())
            if i % 2:
                await asyncio.sleep(rng.uniform(0, 0.003))
            else:  # a few event-loop turns: lands inside even an in-process acquire or release
                for _ in range(rng.randrange(1, 6)):
                    await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
            if blocker is not None:
                await blocker
            # wherever the cancellation landed, the lock is free for somebody else
            # right away (not after the ttl)
            async with asyncio.timeout(TTL / 2):
                async with other.lock("fuzz"):
                    pass
        assert cancelled > 0
