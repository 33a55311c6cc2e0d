"""Adversarial checks of the fair lock, read-write lock and semaphore: the
interleavings the other suites do not try (loss under a joined read,
cancellation at each step of a queued acquire, timeouts racing a hand-over,
clients with different views of one name). Each defect found is an xfail
test that names it; the passing tests document checked behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import asynclock
from asynclock import LockLost, LockTimeout
from tests.conftest import make_harness
from tests.harness import Harness
from tests.servers import scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


@pytest.mark.xfail(
    reason="_locks: Locks._joined is not cleared when the write lease is lost inside `async with rw.read` "
    "(its __aexit__ skips release on loss), so the task's next write counts as a joined read: "
    "WriteLock.release raises NotHeld and the new write hold is never released",
    strict=True,
)
async def test_write_is_released_after_an_earlier_write_was_lost_under_a_joined_read(harness: Harness) -> None:
    locks, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    rw = locks.rw_lock("joined")
    with pytest.raises(LockLost):
        async with rw.write:
            async with rw.read:
                assert await harness.expire_shape("write", "joined")
                await asyncio.sleep(scaled(5))  # cancelled by the loss
    # The same task takes the write side again and leaves it normally.
    async with rw.write:
        pass
    assert not rw.write.held
    async with other.rw_lock("joined").write as lease:  # nobody holds it any more
        assert lease.token is not None


@pytest.mark.xfail(
    reason="_locks: Locks._joined outlives the lost write lease, so a fresh read of the same task "
    "is taken for a joined one: read.held is False and its release goes to the write side (NotHeld), "
    "leaving the read hold renewed for ever",
    strict=True,
)
async def test_a_read_taken_after_a_lost_downgrade_is_released(harness: Harness) -> None:
    locks, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    rw = locks.rw_lock("down")
    await rw.write.acquire()
    await rw.read.acquire()  # joins the write hold
    await rw.write.release()  # a downgrade: the read (on the write hold) remains
    assert await harness.expire_shape("write", "down")
    # The loss is found by the watchdog; the task then reads afresh.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while rw.read.held:
        assert loop.time() < deadline, "the loss of the write hold was never noticed"
        await asyncio.sleep(0.01)
    async with rw.read:
        assert rw.read.held
    assert not rw.read.held
    async with other.rw_lock("down").write:  # the fresh read was given back
        pass


@pytest.fixture(params=["zookeeper", "postgres"])
async def same_lock_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


@pytest.mark.xfail(
    reason="_locks: holds are keyed by (shape, name), but on ZooKeeper and PostgreSQL the fair lock is "
    "the plain lock: a task holding one waits for itself on the other (LockTimeout, or a hang without "
    "timeout) instead of re-entering",
    strict=True,
)
async def test_the_holder_of_a_plain_lock_reenters_the_fair_lock_that_is_the_same_lock(
    same_lock_harness: Harness,
) -> None:
    locks = same_lock_harness.connect(ttl=TTL)
    plain, fair = locks.lock("same"), locks.lock("same", fair=True)
    async with plain:
        # The fair lock "same" *is* the plain lock "same" here: the task that
        # holds one holds the other (on memory and Redis they are unrelated
        # and both are taken at once). Waiting would wait for ourselves.
        lease = await fair.acquire(timeout=SHORT)
        assert lease is not None
        await fair.release()


@pytest.fixture(params=["memory", "redis", "zookeeper", "postgres"])
async def any_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


async def _queued(lock: asynclock.Lock, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while (await lock.info()).waiters != count:
        assert loop.time() < deadline, f"{count} waiters never queued on {lock!r}"
        await asyncio.sleep(0.01)


async def test_closing_a_client_ends_queued_acquires_of_every_shape(any_harness: Harness) -> None:
    """Queued reads, writes, fair and semaphore acquires of one client all end with
    BackendUnavailable when it is closed, and every queue is empty afterwards."""
    holder, closing = any_harness.connect(ttl=TTL), any_harness.connect(ttl=TTL)
    held = [holder.rw_lock("shut").write, holder.lock("shut", fair=True), holder.semaphore("shut", permits=1)]
    for lock in held:
        await lock.acquire()
    waiting = [
        closing.rw_lock("shut").read,
        closing.rw_lock("shut").write,
        closing.lock("shut", fair=True),
        closing.semaphore("shut", permits=1),
    ]
    tasks = [asyncio.create_task(lock.acquire()) for lock in waiting]
    if any_harness.kind != "zookeeper":  # (the waiters count is what every other backend reports)
        await _queued(held[0], 2)
        await _queued(held[2], 1)
    else:
        await asyncio.sleep(scaled(0.3))
    await closing.aclose()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), scaled(5))
    assert all(isinstance(r, asynclock.BackendUnavailable) for r in results), results
    for lock in held:
        await lock.release()
    other = any_harness.connect(ttl=TTL)
    for lock in (other.rw_lock("shut").write, other.lock("shut", fair=True), other.semaphore("shut", permits=1)):
        async with lock:
            pass


async def test_names_with_braces_slashes_and_unicode(any_harness: Harness) -> None:
    a, b = any_harness.connect(ttl=TTL), any_harness.connect(ttl=TTL)
    for name in ("a{b}c", "}{", "ünï cödé", "x:{y}:rw"):
        for kind in ("fair", "write", "semaphore"):
            mine, theirs = _shaped(a, kind, name), _shaped(b, kind, name)
            async with mine as lease:
                with pytest.raises(LockTimeout):
                    await theirs.acquire(timeout=0)
                info = await theirs.info()
                assert info.held and info.token == lease.token, (name, info)
            async with theirs:
                pass


async def test_losing_one_permit_keeps_the_clients_other_permits(harness: Harness) -> None:
    locks = harness.connect(ttl=TTL)
    sem = locks.semaphore("loss", permits=3)
    leases: list[asynclock.Lease] = []
    release = asyncio.Event()
    lost: list[asynclock.Lease] = []

    async def hold() -> None:
        async with sem as lease:
            leases.append(lease)
            try:
                await release.wait()
            except asyncio.CancelledError:
                lost.append(lease)
                raise

    tasks = [asyncio.create_task(hold()) for _ in range(3)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while len(leases) < 3:
        assert loop.time() < deadline
        await asyncio.sleep(0.01)
    victim = leases[0]
    if harness.kind == "memory":
        from asynclock.backends import memory

        key = memory._queue_key(harness.prefix, "semaphore", "loss")
        with memory._QUEUES._mutex:
            del memory._QUEUES._resources[key].holders[victim._hold]
    else:
        admin = harness.admin  # type: ignore[attr-defined]
        base = f"{harness.prefix}:{{loss}}:sem"
        assert await admin.zrem(base, victim._hold) == 1
        await admin.hdel(f"{base}:data", victim._hold)
    await asyncio.wait_for(victim.wait_lost(), scaled(5))
    await asyncio.sleep(2 * TTL)  # several renewals of the others
    assert not leases[1].lost and not leases[2].lost
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(map(type, results), key=str) == sorted([LockLost, type(None), type(None)], key=str), results
    assert lost == [victim]


async def test_one_adapters_failing_renewals_do_not_lose_the_other_shapes_leases(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = harness.connect(ttl=TTL)
    plain, fair, sem = locks.lock("group"), locks.lock("group", fair=True), locks.semaphore("group", permits=2)
    p, f, s = await plain.acquire(), await fair.acquire(), await sem.acquire()

    async def broken(items: object) -> list[bool | BaseException]:
        raise ConnectionError("the semaphore's server connection is down")

    monkeypatch.setattr(sem._backend, "renew", broken)
    await asyncio.wait_for(s.wait_lost(), scaled(5))
    await asyncio.sleep(TTL)
    assert not p.lost and not f.lost
    await plain.release()
    await fair.release()
    monkeypatch.undo()


def _shaped(locks: asynclock.Locks, kind: str, name: str) -> asynclock.Lock:
    if kind == "fair":
        return locks.lock(name, fair=True)
    if kind == "write":
        return locks.rw_lock(name).write
    return locks.semaphore(name, permits=1)


@pytest.mark.parametrize("kind", ["fair", "write", "semaphore"])
async def test_a_timeout_racing_the_hand_over_never_strands_the_lock(any_harness: Harness, kind: str) -> None:
    """The waiter's timeout runs out about when the holder releases: either the
    waiter gets the lease, or it raises LockTimeout and the lock is free; never
    a hold that nobody knows about."""
    import random

    rng = random.Random(8)
    holder, waiter, third = (any_harness.connect(ttl=TTL) for _ in range(3))
    wait = scaled(0.05)

    async def try_once(lock: asynclock.Lock) -> str:
        try:
            await lock.acquire(timeout=wait)
        except LockTimeout:
            return "timeout"
        await lock.release()
        return "acquired"

    outcomes = []
    for i in range(12):
        name = f"race{i}"
        held = _shaped(holder, kind, name)
        await held.acquire()
        task = asyncio.create_task(try_once(_shaped(waiter, kind, name)))
        await asyncio.sleep(wait + rng.uniform(-0.015, 0.01))
        await held.release()
        outcomes.append(await asyncio.wait_for(task, scaled(5)))
        probe = _shaped(third, kind, name)
        await probe.acquire(timeout=scaled(0.3))  # free (within a request's time), not stranded
        await probe.release()
    assert set(outcomes) <= {"timeout", "acquired"}
