"""The contract of what a client reports, and of closing it: events, their timings, a failing callback."""

from __future__ import annotations

import asyncio

import pytest

import asynclock
from asynclock import LockTimeout, NotHeld

from ._harness import TTL, Harness, has_tokens, scaled

__all__ = ["EventsAndClosing"]


class EventsAndClosing:
    """The client's events (kinds, times, a failing callback) and what closing it does."""

    async def test_events_are_reported(self, harness: Harness) -> None:
        events: list[asynclock.LockEvent] = []
        locks = harness.connect(ttl=TTL, on_event=events.append)
        lock = locks.lock("ev")
        async with lock:
            await asyncio.sleep(TTL * 0.6)  # at least one renewal
            other = asyncio.create_task(lock.acquire(timeout=0))
            with pytest.raises(LockTimeout):
                await other
        lease = await lock.acquire()
        await harness.expire("ev")
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        await asyncio.sleep(0)
        kinds = [event.kind for event in events]
        for kind in ("acquired", "renewed", "timeout", "released", "lost"):
            assert kind in kinds, kinds
        released = next(e for e in events if e.kind == "released")
        assert released.held_s is not None and released.held_s > 0
        lost = next(e for e in events if e.kind == "lost")
        assert lost.reason

    async def test_a_failing_event_callback_is_logged_not_raised(
        self, harness: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(event: asynclock.LockEvent) -> None:
            raise RuntimeError("callback bug")

        locks = harness.connect(ttl=TTL, on_event=broken)
        async with locks.lock("cb"):
            pass
        await asyncio.sleep(0.01)
        assert "callback bug" in caplog.text

    async def test_held_time_in_events_leaves_out_the_wait(self, harness: Harness) -> None:
        """``held_s`` counts from the grant: a waiter that releases at once held it
        for less time than it waited (on every backend, queueing ones included)."""
        events: list[asynclock.LockEvent] = []
        first = harness.connect(ttl=TTL)
        second = harness.connect(ttl=TTL, on_event=events.append)
        holder, waiter = first.lock("held-time"), second.lock("held-time")
        await holder.acquire()
        await waiter.info()  # connected now: what the waiter's acquire measures is all waiting

        async def acquire_and_release() -> None:
            await waiter.acquire()
            await waiter.release()

        waiting = asyncio.create_task(acquire_and_release())
        await asyncio.sleep(0.3)
        await holder.release()
        await asyncio.wait_for(waiting, scaled(10))
        async with asyncio.timeout(scaled(5)):
            while not any(event.kind == "released" for event in events):
                await asyncio.sleep(0.01)  # events are delivered on later loop iterations
        acquired = next(event for event in events if event.kind == "acquired")
        released = next(event for event in events if event.kind == "released")
        assert acquired.wait_s is not None and released.held_s is not None
        assert released.held_s < acquired.wait_s, (released.held_s, acquired.wait_s)

    async def test_aclose_releases_what_the_client_holds(self, harness: Harness) -> None:
        a = harness.connect(ttl=scaled(10))
        b = harness.connect(ttl=scaled(10))
        await a.lock("close").acquire()
        await a.aclose()
        async with b.lock("close") as lease:  # at once, not after the 10 s ttl
            assert (lease.token is not None) == has_tokens(harness)
        with pytest.raises(RuntimeError):
            await a.lock("close").acquire()

    async def test_a_closed_client_says_so(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("closing")
        lease = await lock.acquire()
        await locks.aclose()
        for make in (lambda: locks.lock("x"), lambda: locks.rw_lock("x"), lambda: locks.semaphore("x", permits=2)):
            with pytest.raises(RuntimeError, match="client is closed"):
                make()
        for call in (lock.acquire, lock.release, lock.info):
            with pytest.raises(RuntimeError, match="client is closed"):
                await call()
        with pytest.raises(NotHeld):
            await lease.release()  # released by the close
