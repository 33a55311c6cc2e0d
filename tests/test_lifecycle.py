"""A service's life with a lock: "wait at most S, then hold for the block" in
one step, a cap on a wedged hold, and mistakes that name themselves. Run on
every backend."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout, LossReason
from tests.harnesses import Harness
from tests.servers import free_port, scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Every backend but Redlock serves the read-write lock and the semaphore.
SHARED = ("memory", "redis", "postgres", "zookeeper", "etcd")


def _handles(locks: asynclock.Locks, harness: Harness, name: str) -> list[asynclock.Lock]:
    handles: list[asynclock.Lock] = [locks.lock(name)]
    if harness.kind in SHARED:
        handles += [locks.rw_lock(f"{name}-rw").write, locks.semaphore(f"{name}-sem", permits=1)]
    return handles


async def test_async_with_acquire_holds_for_the_block_and_releases_after(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    other = harness.connect(ttl=TTL)
    for lock in _handles(locks, harness, "block"):
        rival = other.rw_lock(lock.name).write if isinstance(lock, asynclock.WriteLock) else None
        if isinstance(lock, asynclock.Semaphore):
            rival = other.semaphore(lock.name, permits=1)
        rival = rival or other.lock(lock.name)
        async with lock.acquire(timeout=scaled(5)) as lease:
            assert lock.held and not lease.lost
            with pytest.raises(LockTimeout):
                await rival.acquire(timeout=0)
        assert not lock.held
        async with rival.acquire(timeout=scaled(5)):
            pass  # released on the server, not only in the client


async def test_async_with_acquire_times_out_while_another_holds_and_holds_nothing(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    other = harness.connect(ttl=TTL)
    entered = False
    async with other.lock("busy"):
        with pytest.raises(LockTimeout):
            async with locks.lock("busy").acquire(timeout=scaled(0.2)):
                entered = True
    assert not entered and not locks.lock("busy").held
    async with locks.lock("busy").acquire(timeout=scaled(5)):
        pass


async def test_a_loss_inside_async_with_acquire_cancels_the_block(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    reached_end = False
    with pytest.raises(LockLost):
        async with locks.lock("lost").acquire(timeout=scaled(5)):
            assert await harness.expire("lost")
            await asyncio.sleep(scaled(10))
            reached_end = True
    assert not reached_end


async def test_acquire_is_still_a_coroutine_for_create_task_and_checks_arguments_at_once(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("task")

    async def hold() -> None:
        lease = await asyncio.create_task(lock.acquire(timeout=scaled(5)))
        assert lease.token is not None or not harness.has_tokens
        await lease.release()

    await hold()
    with pytest.raises(ValueError, match="timeout"):
        lock.acquire(timeout=-1)
    with pytest.raises(TypeError, match="detached"):
        lock.acquire(detached="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("await lock.acquire")):
        async with lock.acquire(detached=True):
            pass
    assert not lock.held


async def test_with_and_await_on_a_handle_say_what_to_write_instead(harness: Harness) -> None:
    lock = harness.connect(ttl=TTL).lock("mistake")
    with pytest.raises(TypeError, match="async with"):
        with lock:  # type: ignore[attr-defined]
            pass
    with pytest.raises(TypeError, match=re.escape("await lock.acquire")):
        await lock  # type: ignore[misc]
    assert not lock.held


async def test_max_hold_cancels_a_wedged_body_and_frees_the_lock(harness: Harness) -> None:
    events: list[asynclock.LockEvent] = []
    locks = harness.connect(ttl=TTL, on_event=events.append)
    other = harness.connect(ttl=TTL)
    cap = scaled(0.5)
    loop = asyncio.get_running_loop()
    for lock in _handles(locks, harness, "wedged"):
        capped = type(lock)
        lock = (
            locks.lock(lock.name, max_hold=cap)
            if capped is asynclock.Lock
            else locks.rw_lock(lock.name, max_hold=cap).write
            if capped is asynclock.WriteLock
            else locks.semaphore(lock.name, permits=1, max_hold=cap)
        )
        assert lock.max_hold == cap
        started = loop.time()
        with pytest.raises(LockLost) as lost:
            async with lock as lease:
                await asyncio.sleep(scaled(30))  # a stuck call
        assert lost.value.reason == "max_hold" and lost.value.loss is LossReason.MAX_HOLD
        assert lease.lost and loop.time() - started >= cap
        rival = (
            other.lock(lock.name)
            if capped is asynclock.Lock
            else other.rw_lock(lock.name).write
            if capped is asynclock.WriteLock
            else other.semaphore(lock.name, permits=1)
        )
        async with rival.acquire(timeout=scaled(5)):
            pass  # the server let it go
    assert any(event.kind == "lost" and event.loss is LossReason.MAX_HOLD for event in events)


async def test_a_hold_released_before_its_max_hold_is_not_lost_later(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("brief", max_hold=scaled(0.3))
    async with lock as lease:
        async with lock:  # a re-entry does not start a cap of its own
            pass
    await asyncio.sleep(scaled(0.5))
    assert not lease.lost
    lease = await lock.acquire(detached=True)  # a detached hold is capped too
    assert await asyncio.wait_for(lease.wait_lost(), scaled(5)) == "max_hold"


def test_max_hold_is_checked_before_any_io() -> None:
    locks = asynclock.connect("redis://127.0.0.1:1/0")
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="max_hold"):
            locks.lock("x", max_hold=bad)
    with pytest.raises(TypeError, match="max_hold"):
        locks.rw_lock("x", max_hold="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_hold"):
        locks.semaphore("x", permits=2, max_hold=0)


def test_a_scheme_typo_is_told_the_closest_scheme_without_the_password() -> None:
    with pytest.raises(ValueError, match=re.escape("did you mean redis://?")) as typo:
        asynclock.connect("reddis://user:hunter2@127.0.0.1:1/0")
    assert "hunter2" not in str(typo.value) and "memory://" in str(typo.value)
    with pytest.raises(ValueError, match="unknown lock URL scheme 'gopher'") as far:
        asynclock.connect("gopher://127.0.0.1:1")
    assert "did you mean" not in str(far.value)


_EXITS_HOLDING = """
import asyncio, sys
import asynclock

async def main() -> None:
    locks = asynclock.connect(sys.argv[1], prefix=sys.argv[2], ttl=float(sys.argv[3]))
    await locks.lock("owned").acquire()
    await locks.lock("detached").acquire(detached=True)
    print("held", flush=True)
    # no aclose(): the process's asyncio.run ends with the client open

asyncio.run(main())
"""


async def test_a_client_never_closed_releases_its_holds_when_asyncio_run_ends(harness: Harness) -> None:
    if harness.kind == "memory":
        pytest.skip("memory:// locks live in the process: nothing outlives it")
    ttl = scaled(20)  # were the holds left to expire, the checks below would find them held
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _EXITS_HOLDING, harness.url, harness.prefix, str(ttl),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    async with asyncio.timeout(scaled(30)):
        out, err = await child.communicate()
    assert child.returncode == 0, err.decode()
    assert out.decode().split() == ["held"]
    log = err.decode()
    assert "released 'detached', 'owned'" in log, log
    other = harness.connect(ttl=TTL)
    for name in ("owned", "detached"):
        async with other.lock(name).acquire(timeout=0):
            pass  # free at once, not after the ttl


async def test_aclose_with_drain_lets_a_body_finish_in_time_and_cancels_one_that_does_not(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    other = harness.connect(ttl=TTL)
    drain = scaled(0.6)
    finished: list[str] = []

    async def body(name: str, takes: float) -> str:
        try:
            async with locks.lock(name):
                await asyncio.sleep(takes)
                finished.append(name)
                return "done"
        except LockLost as lost:
            return f"lost: {lost.reason} ({lost.loss})"

    quick = asyncio.create_task(body("quick", scaled(0.2)))
    slow = asyncio.create_task(body("slow", scaled(30)))
    async with asyncio.timeout(scaled(5)):
        while not (locks.lock("quick").held or await _held_elsewhere(other, "quick")):
            await asyncio.sleep(0.01)
        while not await _held_elsewhere(other, "slow"):
            await asyncio.sleep(0.01)
    async with other.lock("quick-next"):  # held elsewhere, so this client's acquire waits
        waiting_here = asyncio.create_task(locks.lock("quick-next").acquire(timeout=scaled(30)))
        await asyncio.sleep(scaled(0.1))
        assert not waiting_here.done()
        closing = asyncio.create_task(locks.aclose(drain=drain))
        with pytest.raises(RuntimeError, match="client is closing"):
            async with asyncio.timeout(scaled(5)):
                await waiting_here  # a waiter of the closing client ends at once
        with pytest.raises(RuntimeError, match="client is closing"):
            await locks.lock("new").acquire(timeout=0)
        async with asyncio.timeout(scaled(10)):
            await closing
    assert await quick == "done" and finished == ["quick"]
    assert await slow == f"lost: closing ({LossReason.CLOSING})"
    for name in ("quick", "slow"):
        async with other.lock(name).acquire(timeout=0):
            pass  # released on the server by the close
    with pytest.raises(RuntimeError, match="client is closed"):
        locks.lock("after")


async def test_aclose_with_drain_waits_for_the_release_of_the_last_body_to_end(harness: Harness) -> None:
    """The last body ends while the drain waits for it (a service's stop signal reached it):
    its release goes out before the client's connections close, so the body's ``async with``
    raises nothing and a waiter elsewhere gets the lock at once, not after the 10 s ttl."""
    locks = harness.connect(ttl=scaled(10))
    other = harness.connect(ttl=scaled(10))
    stop = asyncio.Event()
    entered = asyncio.Event()

    async def body() -> str:
        async with locks.lock("handed"):
            entered.set()
            await stop.wait()
        return "done"

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), scaled(5))
    waiter = asyncio.create_task(other.lock("handed").acquire(timeout=scaled(30), detached=True))
    await asyncio.sleep(scaled(0.1))
    assert not waiter.done()
    stop.set()
    await asyncio.wait_for(locks.aclose(drain=scaled(5)), scaled(10))
    assert await task == "done"
    lease = await asyncio.wait_for(waiter, scaled(0.5))
    await lease.release()


async def test_aclose_with_drain_from_inside_a_body_does_not_wait_for_that_body(harness: Harness) -> None:
    """The task that closes its client from inside its own ``async with`` cannot
    finish that body while it waits: the drain waits for the other bodies only
    (a long drain returns as soon as they end), and the closing body itself is
    told at its block's end, with LockLost(reason="closing")."""
    locks = harness.connect(ttl=scaled(10))
    other_done = asyncio.Event()
    entered = asyncio.Event()

    async def other_body() -> None:
        async with locks.lock("other"):
            entered.set()
            await asyncio.sleep(scaled(0.3))
        other_done.set()

    task = asyncio.create_task(other_body())
    await asyncio.wait_for(entered.wait(), scaled(5))
    loop = asyncio.get_running_loop()
    with pytest.raises(LockLost) as lost:
        async with locks.lock("mine"):
            started = loop.time()
            await locks.aclose(drain=scaled(30))
            took = loop.time() - started
            assert other_done.is_set()  # the other body was let finish
    assert lost.value.loss is LossReason.CLOSING
    assert took < scaled(10), took  # not the whole drain, waiting for itself
    await task


async def _held_elsewhere(other: asynclock.Locks, name: str) -> bool:
    return (await other.lock(name).info()).owner is not None


async def test_aclose_with_drain_hands_leadership_to_the_next_candidate(harness: Harness) -> None:
    if harness.kind == "redlock":
        pytest.skip("Redlock has no elections")
    leader = harness.connect(ttl=TTL)
    follower = harness.connect(ttl=TTL)
    led = asyncio.Event()
    outcome: list[str] = []

    async def lead() -> None:
        try:
            async with leader.election("sched").leadership():
                led.set()
                await asyncio.sleep(scaled(30))
        except LockLost as lost:
            outcome.append(lost.reason)

    task = asyncio.create_task(lead())
    async with asyncio.timeout(scaled(5)):
        await led.wait()
    second = asyncio.create_task(_lead_once(follower))
    await asyncio.sleep(scaled(0.1))
    assert not second.done()
    async with asyncio.timeout(scaled(10)):
        await leader.aclose(drain=scaled(0.2))
        await task
        assert await second == "led"
    assert outcome == ["closing"]


async def _lead_once(locks: asynclock.Locks) -> str:
    async with locks.election("sched").leadership():
        return "led"


async def test_health_reports_a_round_trip_and_what_the_client_holds(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    assert await locks.open() is locks
    health = await locks.health()
    assert health.ok and health.error is None and health.latency is not None and health.latency >= 0
    assert (health.held, health.at_risk) == (0, 0)
    async with locks.lock("probe-held"), locks.lock("other-held"):
        health = await locks.health()
        assert health.ok and (health.held, health.at_risk) == (2, 0)
    await locks.aclose()
    closed = await locks.health()
    assert not closed.ok and closed.error == "client is closed" and closed.latency is None


async def test_health_never_raises_for_a_server_that_is_not_there() -> None:
    locks = asynclock.connect("redis://127.0.0.1:1/0", connect_timeout=scaled(1))
    try:
        health = await locks.health()
        assert not health.ok and health.latency is None and health.held == 0
        assert health.error is not None and "127.0.0.1:1" in health.error
    finally:
        await locks.aclose()


def _nothing_listening() -> list[str]:
    closed = [free_port() for _ in range(3)]
    hosts = ",".join(f"127.0.0.1:{port}" for port in closed)
    return [
        f"redis://127.0.0.1:{closed[0]}/0",
        f"redis+sentinel://127.0.0.1:{closed[0]}/mymaster",
        f"redis+cluster://{hosts}",
        f"redlock://{hosts}",
        f"postgresql://nobody@127.0.0.1:{closed[0]}/db",
        f"zk://{hosts}",
        f"etcd://{hosts}",
    ]


@pytest.mark.parametrize("url", _nothing_listening(), ids=lambda url: url.split("://")[0])
async def test_entering_a_client_with_nothing_listening_fails_at_once_naming_the_address(url: str) -> None:
    connect_timeout = scaled(10)
    loop = asyncio.get_running_loop()
    for enter in ("async with", "open"):
        locks = asynclock.connect(url, connect_timeout=connect_timeout)
        started = loop.time()
        with pytest.raises(BackendUnavailable) as refused:
            if enter == "open":
                await locks.open()
            else:
                async with locks:
                    pass
        # a refusal is an answer: not a wait for the connect timeout
        assert loop.time() - started < connect_timeout / 2, (enter, url)
        assert "127.0.0.1:" in str(refused.value) and "refused" in str(refused.value).lower(), str(refused.value)
        await locks.aclose()
