"""The contract of a lease: renewed while its owner lives, lost when the server lets it go or its deadline passes.

A lost lease cancels the body under it; a lease is also let go by a release
from another task and by the end of its owner task, and a detached lease
belongs to no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

import asynclock
from asynclock import LockLost, LockTimeout, NotHeld

from ._harness import TTL, Harness, free_now, has_tokens, scaled, stop_renewing

__all__ = ["Leases"]


class Leases:
    """A lease's life: renewal, loss and the body's cancellation, the owner task, detached leases."""

    async def test_renewal_keeps_the_lock_past_its_ttl(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        async with a.lock("long") as lease:
            first_deadline = lease.expires_at
            await asyncio.sleep(TTL * 3)
            assert not lease.lost
            assert lease.expires_at > first_deadline
            with pytest.raises(LockTimeout):
                await b.lock("long").acquire(timeout=0)

    async def test_loss_cancels_the_body_and_raises_lock_lost(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("lost")
        loop = asyncio.get_running_loop()
        cancelled_at: list[float] = []
        child_cancelled = asyncio.Event()
        deadline_seen: list[float] = []

        async def child() -> None:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                child_cancelled.set()
                raise

        with pytest.raises(LockLost) as caught:
            async with lock as lease:
                assert await harness.expire("lost")
                deadline_seen.append(lease.expires_at)
                try:
                    async with asyncio.TaskGroup() as group:
                        group.create_task(child())
                        await asyncio.sleep(100)
                finally:
                    cancelled_at.append(loop.time())
        assert caught.value.name == "lost"
        assert lease.lost and lease.lost_reason
        assert child_cancelled.is_set(), "a task group inside the body is cancelled with it"
        # cancelled by the next renewal at the latest, and never after the trusted deadline
        assert cancelled_at[0] <= deadline_seen[0] + 0.05
        assert await asyncio.wait_for(lease.wait_lost(), 1) == lease.lost_reason
        assert not lock.held

    async def test_a_holder_that_stops_renewing_loses_the_lock_after_its_ttl(self, harness: Harness) -> None:
        dead = harness.connect(ttl=TTL)
        alive = harness.connect(ttl=TTL)
        lease = await dead.lock("crash").acquire()
        # the holder "dies": its watchdog stops and it never releases
        await stop_renewing(dead)
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with alive.lock("crash") as taken:
            if has_tokens(harness):
                assert taken.token is not None and lease.token is not None and taken.token > lease.token
        assert loop.time() - start <= TTL + scaled(1.0)
        assert lease.lost  # its own trusted deadline has passed too

    async def test_lease_outside_async_with_reports_loss(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("manual")
        lease = await lock.acquire()
        waiting = asyncio.create_task(lease.wait_lost())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await harness.expire("manual")
        reason = await asyncio.wait_for(waiting, scaled(5))
        assert reason and lease.lost and not lock.held

    async def test_body_is_cancelled_at_its_deadline_even_if_the_watchdog_stalls(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        loop = asyncio.get_running_loop()
        ended_at: list[float] = []
        with pytest.raises(LockLost):
            async with locks.lock("stall") as lease:
                await stop_renewing(locks)  # no more renewals, and nobody tells the lease
                try:
                    await asyncio.sleep(100)
                finally:
                    ended_at.append(loop.time())
        assert lease.lost
        assert ended_at[0] <= lease.expires_at + 0.05

    async def test_a_hold_whose_owner_task_ended_is_abandoned_and_released_at_once(
        self, harness: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A task that ends still holding (returns, raises, is cancelled) does not
        keep the lock renewed for ever: the hold is released on the server at once,
        with a WARNING naming the lock and the task, and an "abandoned" event."""
        events: list[asynclock.LockEvent] = []
        locks = harness.connect(ttl=TTL, on_event=events.append)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("abandoned")
        holding = asyncio.Event()

        async def returns() -> None:
            await lock.acquire()

        async def raises() -> None:
            await lock.acquire()
            await lock.acquire()  # both holds go
            raise RuntimeError("the handler failed")

        async def is_cancelled() -> None:
            await lock.acquire()
            holding.set()
            await asyncio.sleep(3600)

        for ending in (returns, raises, is_cancelled):
            holding.clear()
            task = asyncio.create_task(ending(), name=f"owner-{ending.__name__}")
            if ending is is_cancelled:
                await holding.wait()
                task.cancel()
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                await task
            await free_now(other, "abandoned")  # the renewals would have kept it for ever
        async with asyncio.timeout(scaled(5)):
            while sum(event.kind == "abandoned" for event in events) < 3:
                await asyncio.sleep(0.01)
        warnings = [r.getMessage() for r in caplog.records if r.name == "asynclock" and r.levelno == logging.WARNING]
        for name in ("owner-returns", "owner-raises", "owner-is_cancelled"):
            assert any("'abandoned'" in text and name in text for text in warnings), warnings
        assert all(event.name == "abandoned" for event in events if event.kind == "abandoned")
        assert not lock.held

    async def test_lease_release_from_another_task_cancels_the_holders_body(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("handed")
        holding = asyncio.Event()
        leases: list[asynclock.Lease] = []

        async def body() -> None:
            async with lock as lease:
                await lock.acquire()  # every hold goes with the lease
                leases.append(lease)
                holding.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(body())
        await holding.wait()
        await leases[0].release()
        with pytest.raises(LockLost, match=r"released by lease\.release"):
            await task
        with pytest.raises(NotHeld):
            await leases[0].release()
        await free_now(other, "handed")
        # From inside its own block, the holder's task leaves quietly.
        async with lock as lease:
            await lease.release()
            assert not lock.held
        await free_now(other, "handed")

    async def test_detached_lease_belongs_to_no_task_and_lives_until_released(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("detached")
        lease = await asyncio.create_task(lock.acquire(detached=True))  # that task ends at once
        await asyncio.sleep(TTL * 1.2)  # renewed, not abandoned
        assert not lease.lost
        with pytest.raises(LockTimeout):
            await other.lock("detached").acquire(timeout=0)
        assert not lock.held  # no task holds it
        with pytest.raises(NotHeld):
            await lock.release()
        with pytest.raises(LockTimeout):  # no re-entry: a second detached acquire waits like anyone
            await lock.acquire(timeout=0, detached=True)
        await lease.release()
        await free_now(other, "detached")
        with pytest.raises(TypeError):
            await lock.acquire(detached=1)  # type: ignore[arg-type]
