"""``asynclock.testing``: the fault controls of a memory:// client, and lease
health (``remaining``, ``at_risk``, ``wait_at_risk()``, the "at_risk" event)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

import asynclock
from asynclock import BackendUnavailable, LockLost, LossReason
from asynclock.testing import faults
from tests.servers import RedisServer, scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


def memory(**options: object) -> asynclock.Locks:
    return asynclock.connect("memory://", ttl=TTL, prefix=f"kit{secrets.token_hex(4)}", **options)  # type: ignore[arg-type]


async def test_lose_cancels_the_holders_body_now_with_lock_lost() -> None:
    events: list[asynclock.LockEvent] = []
    async with memory(on_event=events.append) as locks, memory() as other:
        chaos = faults(locks)
        loop = asyncio.get_running_loop()
        with pytest.raises(LockLost) as caught:
            async with locks.lock("job"):
                lost_at = loop.time()
                assert chaos.lose("job")
                await asyncio.sleep(10 * TTL)
        assert loop.time() - lost_at < TTL / 3  # at once, not at the next renewal
        assert caught.value.loss is LossReason.TAKEN_OR_EXPIRED
        assert not chaos.lose("job")  # nothing held any more
        async with other.lock("job"):  # and the lock is free
            pass
        await asyncio.sleep(0)
        assert [event.kind for event in events if event.kind == "lost"] == ["lost"]


async def test_lose_reaches_every_primitive_of_the_name() -> None:
    async with memory() as locks:
        chaos = faults(locks)
        for handle in (locks.lock("p", fair=True), locks.rw_lock("p").write, locks.semaphore("p", permits=2)):
            lease = await handle.acquire()
            assert chaos.lose("p")
            await asyncio.wait_for(lease.wait_lost(), scaled(1))


async def test_stalled_renewals_put_the_lease_at_risk_before_it_is_lost() -> None:
    events: list[asynclock.LockEvent] = []
    async with memory(on_event=events.append) as locks:
        chaos = faults(locks)
        loop = asyncio.get_running_loop()
        with pytest.raises(LockLost) as caught:
            async with locks.lock("slow") as lease:
                assert not lease.at_risk and 0 < lease.remaining <= TTL
                chaos.stall_renewals()
                reason = await asyncio.wait_for(lease.wait_at_risk(), 2 * TTL)
                at_risk_at = loop.time()
                assert "did not answer" in reason and lease.at_risk and not lease.lost
                assert 0 < lease.remaining < TTL
                await asyncio.sleep(10 * TTL)
        assert caught.value.loss is LossReason.RENEWAL_FAILED
        assert lease.remaining == 0
        assert loop.time() >= at_risk_at
        await asyncio.sleep(0)
        kinds = [event.kind for event in events if event.kind in ("at_risk", "lost")]
        assert kinds == ["at_risk", "lost"]


async def test_a_lease_at_risk_recovers_when_renewals_come_back() -> None:
    async with memory() as locks:
        chaos = faults(locks)
        lease = await locks.lock("flaky").acquire()
        chaos.stall_renewals()
        await asyncio.wait_for(lease.wait_at_risk(), 2 * TTL)
        chaos.restore()
        async with asyncio.timeout(scaled(2)):
            while lease.at_risk:
                await asyncio.sleep(0.01)
        assert not lease.lost
        await asyncio.sleep(TTL * 1.5)  # renewed since
        assert not lease.lost and not lease.at_risk
        await lease.release()
        assert lease.remaining == 0


async def test_an_unavailable_backend_fails_acquires_until_restored() -> None:
    async with memory() as locks:
        chaos = faults(locks)
        with chaos.unavailable():
            with pytest.raises(BackendUnavailable, match="unavailable"):
                await locks.lock("down").acquire(timeout=scaled(0.2))
            with pytest.raises(BackendUnavailable):
                await locks.lock("down").info()
        async with locks.lock("down"):
            pass
        chaos.unavailable()
        with pytest.raises(BackendUnavailable):
            await locks.lock("down").acquire(timeout=0)
        chaos.restore()
        async with locks.lock("down"):
            pass


async def test_an_unavailable_backend_puts_held_leases_at_risk_then_loses_them() -> None:
    async with memory() as locks:
        chaos = faults(locks)
        lease = await locks.lock("held").acquire()
        chaos.unavailable()
        reason = await asyncio.wait_for(lease.wait_at_risk(), 2 * TTL)
        assert "unavailable" in reason
        assert await asyncio.wait_for(lease.wait_lost(), 2 * TTL)
        chaos.restore()


async def test_delay_slows_every_request() -> None:
    async with memory() as locks:
        chaos = faults(locks)
        loop = asyncio.get_running_loop()
        chaos.delay(scaled(0.1))
        started = loop.time()
        async with locks.lock("late"):
            pass
        assert loop.time() - started >= scaled(0.2)  # the acquire and the release
        chaos.delay(0)
        with pytest.raises(ValueError):
            chaos.delay(-1)


async def test_fault_controls_are_for_memory_clients(redis_server: RedisServer) -> None:
    async with asynclock.connect(redis_server.url, ttl=TTL) as locks:
        with pytest.raises(TypeError, match="memory://"):
            faults(locks)
