"""``asynclock.testing``: the fault controls of a memory:// client, and lease
health (``remaining``, ``at_risk``, ``wait_at_risk()``, the "at_risk" event)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time

import pytest

import asynclock
from asynclock import BackendUnavailable, LockLost, LossReason
from asynclock.testing import faults, memory_client, virtual_clock
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


# -- the virtual clock -------------------------------------------------------------


async def test_the_virtual_clock_jumps_to_each_timer_in_deadline_order() -> None:
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    real_start = time.monotonic()
    async with virtual_clock() as clock:
        start = loop.time()

        async def sleeper(seconds: float) -> None:
            await asyncio.sleep(seconds)
            fired.append((f"sleep {seconds}", loop.time() - start))

        loop.call_later(90, lambda: fired.append(("call_later 90", loop.time() - start)))
        await asyncio.gather(*(sleeper(seconds) for seconds in (3600, 5, 60, 0.5, 1800, 60.001)))
        inside = loop.time()
    assert [what for what, _ in fired] == [
        "sleep 0.5",
        "sleep 5",
        "sleep 60",
        "sleep 60.001",
        "call_later 90",
        "sleep 1800",
        "sleep 3600",
    ]
    for what, at in fired:
        due = float(what.split()[-1])
        assert due <= at < due + scaled(0.5), (what, at)  # at its time, not before, not much after
    assert clock.jumped >= 3600 - scaled(0.5)
    assert time.monotonic() - real_start < scaled(1.0)  # an hour of loop time took no real time
    assert loop.time() >= inside  # off again, the clock kept what it gained: it never runs backwards
    await asyncio.sleep(0.01)  # and real sleeps are real again
    assert time.monotonic() - real_start >= 0.01


async def test_a_30s_lease_stalled_past_its_deadline_is_lost_in_well_under_a_second() -> None:
    events: list[asynclock.LockEvent] = []
    loop = asyncio.get_running_loop()
    real_start = time.monotonic()
    async with virtual_clock() as clock, memory_client(ttl=30, on_event=events.append) as locks:
        chaos = faults(locks)
        with pytest.raises(LockLost) as caught:
            async with locks.lock("nightly") as lease:
                acquired_at = loop.time()
                chaos.stall_renewals()
                await asyncio.sleep(3600)
        lost_after = loop.time() - acquired_at
        chaos.restore()
        await asyncio.sleep(0)
    assert caught.value.loss is LossReason.RENEWAL_FAILED
    assert lease.lost and not lease.at_risk
    assert 29 <= lost_after <= 30  # at the trusted deadline: ttl minus the drift allowance
    assert clock.jumped >= 29
    assert time.monotonic() - real_start < scaled(1.0)
    kinds = [event.kind for event in events if event.kind in ("at_risk", "lost")]
    assert kinds == ["at_risk", "lost"]


async def test_under_the_virtual_clock_an_unavailable_backend_gives_up_after_a_ttl() -> None:
    loop = asyncio.get_running_loop()
    real_start = time.monotonic()
    async with virtual_clock(), memory_client(ttl=30) as locks:
        held = await locks.lock("held").acquire()
        with faults(locks).unavailable():
            started = loop.time()
            with pytest.raises(BackendUnavailable):
                await locks.lock("wanted").acquire()  # no timeout: retried for a ttl of failures
            gave_up_after = loop.time() - started
            assert "unavailable" in await held.wait_at_risk()
            assert await held.wait_lost()
    assert 30 <= gave_up_after <= 40
    assert time.monotonic() - real_start < scaled(1.0)


async def test_the_virtual_clock_serves_ready_io_and_threads_before_it_jumps() -> None:
    loop = asyncio.get_running_loop()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with virtual_clock() as clock:
            assert await asyncio.to_thread(sum, [1, 2, 3]) == 6  # no timer due: the loop waits for the thread
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            started = loop.time()
            async with asyncio.timeout(3600):  # a timer is due, but the answer on loopback is ready first
                writer.write(b"ping")
                assert await reader.read(4) == b"ping"
            assert loop.time() - started < scaled(1.0) and clock.jumped < scaled(1.0)
            writer.close()
            await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


async def test_one_virtual_clock_per_loop_at_a_time() -> None:
    loop = asyncio.get_running_loop()
    async with virtual_clock() as clock:
        with pytest.raises(RuntimeError, match="on already"):
            async with virtual_clock():
                pass
        with pytest.raises(RuntimeError, match="on already"):
            clock.__enter__()
        await asyncio.sleep(10)
    first = loop.time()
    async with virtual_clock() as again:  # a second one goes on from the time the first left
        assert again.jumped == 0
        await asyncio.sleep(10)
        assert loop.time() - first >= 10 and again.jumped >= 10 - scaled(0.5)


def test_the_virtual_clock_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        virtual_clock().__enter__()


# -- the isolated client behind the ``locks`` fixture --------------------------------


async def test_memory_client_names_every_lease_and_waiter_left_going() -> None:
    waiters: list[asyncio.Task[asynclock.Lease]] = []
    with pytest.raises(AssertionError) as caught:
        async with memory_client() as locks:
            kept = await locks.lock("kept").acquire(detached=True)
            await locks.lock("queued", fair=True).acquire(detached=True)
            waiters.append(asyncio.create_task(locks.lock("queued", fair=True).acquire(), name="fair-waiter"))
            waiters.append(asyncio.create_task(locks.lock("kept").acquire(), name="plain-waiter"))
            await asyncio.sleep(0.05)
    message = str(caught.value)
    assert "left 4 thing(s)" in message, message
    assert f"lease 'kept' held (token {kept.token}, hold count 1" in message
    assert "lease 'queued' held" in message
    assert "1 acquire(s) of 'kept' still waiting" in message
    assert "an acquire still waiting in a queue (task 'fair-waiter')" in message
    assert kept.lost  # closed all the same
    for waiter in waiters:
        with pytest.raises(BackendUnavailable):  # ended by the close
            await waiter


async def test_memory_client_is_isolated_and_does_not_hide_the_error_of_its_block() -> None:
    async with memory_client() as first, memory_client() as second:
        async with first.lock("same-name"), second.lock("same-name"):  # different prefixes: no contention
            pass
    with pytest.raises(ZeroDivisionError):
        async with memory_client() as locks:
            lease = await locks.lock("held").acquire()
            1 / 0  # noqa: B018
    assert lease.lost  # the client was closed all the same


def test_the_testing_kit_imports_without_pytest_until_the_fixture_is_asked_for() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import asyncio, asynclock.testing as kit\n"
        "async def main():\n"
        "    async with kit.virtual_clock(), kit.memory_client() as locks:\n"
        "        async with locks.lock('x'):\n"
        "            await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
        "try:\n"
        "    kit.locks\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
