"""What the fair lock, the read-write lock and the semaphore promise beyond
being a lock (the contract suite runs on them too, in ``test_shapes.py``):
FIFO order, no queue jumping, readers together and writers alone, writers
not starved, permits never exceeded, a dead holder's permit coming back, and
cancellation leaving nothing behind. Run on every backend that serves them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

import asynclock
from asynclock import LockError, LockTimeout
from tests.conftest import make_harness
from tests.harnesses import Harness, insides
from tests.servers import scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)

#: The backends whose fair lock is their plain lock on the server (one key, one hold):
#: the suites that run on the plain lock cover it there.
FAIR_IS_PLAIN = ["redis", "zookeeper", "postgres", "etcd", "mysql"]

#: The backends that serve each primitive.
SUPPORT: dict[str, list[str]] = {
    "fair": ["memory", "redis", "zookeeper", "postgres", "etcd", "mysql"],
    "rw": ["memory", "redis", "zookeeper", "postgres", "etcd"],
    "semaphore": ["memory", "redis", "zookeeper", "postgres", "etcd", "mysql"],
}


@pytest.fixture(params=SUPPORT["fair"])
async def fair_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


@pytest.fixture(params=SUPPORT["rw"])
async def rw_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


@pytest.fixture(params=SUPPORT["semaphore"])
async def sem_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


def has_tokens(harness: Harness) -> bool:
    return bool(getattr(harness, "has_tokens", True))


async def queued(lock: asynclock.Lock, count: int) -> None:
    """Wait until the server reports ``count`` waiters on ``lock``."""

    async def check() -> bool:
        return (await lock.info()).waiters == count

    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while not await check():
        assert loop.time() < deadline, f"{count} waiters never queued on {lock!r}: {await lock.info()}"
        await asyncio.sleep(0.01)


class Holder:
    """Acquire ``handle`` in a task of its own and hold it until ``release()``."""

    def __init__(self, handle: asynclock.Lock, timeout: float | None = None) -> None:
        self.lease: asynclock.Lease | None = None
        self._release = asyncio.Event()
        self.task = asyncio.create_task(self._run(handle, timeout))

    async def _run(self, handle: asynclock.Lock, timeout: float | None) -> None:
        self.lease = await handle.acquire(timeout=timeout)
        await self._release.wait()
        await handle.release()

    async def got(self) -> asynclock.Lease:
        """Wait (bounded) until it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(10)
        while self.lease is None:
            assert not self.task.done(), self.task
            assert loop.time() < deadline, "never acquired"
            await asyncio.sleep(0.005)
        return self.lease

    async def release(self) -> None:
        await self.got()
        self._release.set()
        await asyncio.wait_for(self.task, scaled(10))


# -- fair lock ----------------------------------------------------------------------


async def test_fair_lock_hands_over_in_the_order_waiters_queued(fair_harness: Harness) -> None:
    clients = [fair_harness.connect(ttl=TTL) for _ in range(5)]
    holder = clients[0].lock("fifo", fair=True)
    order: list[int] = []
    await holder.acquire()

    async def wait(i: int) -> None:
        async with clients[i].lock("fifo", fair=True):
            order.append(i)
            await asyncio.sleep(0.005)

    tasks = []
    for i in range(1, 5):
        tasks.append(asyncio.create_task(wait(i)))
        await queued(holder, i)  # each waiter reached the server before the next starts
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(10))
    assert order == [1, 2, 3, 4]


async def test_fair_lock_timeout_zero_never_jumps_the_queue(fair_harness: Harness) -> None:
    holder, waiter, jumper = (fair_harness.connect(ttl=TTL) for _ in range(3))
    await holder.lock("q", fair=True).acquire()
    got: list[str] = []

    async def wait() -> None:
        async with waiter.lock("q", fair=True):
            got.append("waiter")
            await asyncio.sleep(SHORT)

    task = asyncio.create_task(wait())
    await queued(holder.lock("q", fair=True), 1)
    # Trying right before and right after the release: never ahead of the queued waiter.
    with pytest.raises(LockTimeout):
        await jumper.lock("q", fair=True).acquire(timeout=0)
    await holder.lock("q", fair=True).release()
    with pytest.raises(LockTimeout):
        await jumper.lock("q", fair=True).acquire(timeout=0)
    await asyncio.wait_for(task, scaled(10))
    assert got == ["waiter"]
    async with jumper.lock("q", fair=True):  # and free for anyone afterwards
        pass


async def test_fair_lock_waiter_that_times_out_or_is_cancelled_leaves_the_queue(fair_harness: Harness) -> None:
    holder, quitter, cancelled, patient = (fair_harness.connect(ttl=TTL) for _ in range(4))
    lock = holder.lock("leave", fair=True)
    await lock.acquire()
    with pytest.raises(LockTimeout):
        await quitter.lock("leave", fair=True).acquire(timeout=SHORT)
    gone = asyncio.create_task(cancelled.lock("leave", fair=True).acquire())
    await queued(lock, 1)
    waiting = Holder(patient.lock("leave", fair=True))
    await queued(lock, 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await queued(lock, 1)
    await lock.release()
    lease = await waiting.got()
    assert not lease.lost
    await waiting.release()


# -- read-write lock ----------------------------------------------------------------


async def test_readers_hold_together_and_a_writer_alone(rw_harness: Harness) -> None:
    readers = [rw_harness.connect(ttl=TTL) for _ in range(3)]
    writer = rw_harness.connect(ttl=TTL)
    leases = [await client.rw_lock("doc").read.acquire(timeout=SHORT) for client in readers]
    info = await readers[0].rw_lock("doc").read.info()
    assert len(info.holders) == 3
    with pytest.raises(LockTimeout):
        await writer.rw_lock("doc").write.acquire(timeout=SHORT)
    for client in readers:
        await client.rw_lock("doc").read.release()
    write = await writer.rw_lock("doc").write.acquire(timeout=scaled(5))
    if has_tokens(rw_harness):
        assert all(write.token is not None and lease.token is not None for lease in leases)
        assert write.token > max(lease.token for lease in leases if lease.token is not None)
    with pytest.raises(LockTimeout):
        await readers[0].rw_lock("doc").read.acquire(timeout=SHORT)
    with pytest.raises(LockTimeout):
        await readers[1].rw_lock("doc").write.acquire(timeout=SHORT)
    await writer.rw_lock("doc").write.release()
    async with readers[0].rw_lock("doc").read:
        pass


async def test_a_waiting_writer_keeps_new_readers_out(rw_harness: Harness) -> None:
    first, writer, late = (rw_harness.connect(ttl=TTL) for _ in range(3))
    rw = first.rw_lock("starve")
    await rw.read.acquire()
    writing = Holder(writer.rw_lock("starve").write)
    await queued(rw.write, 1)
    with pytest.raises(LockTimeout):  # a reader arriving after the writer waits behind it
        await late.rw_lock("starve").read.acquire(timeout=SHORT)
    await rw.read.release()
    await writing.got()
    with pytest.raises(LockTimeout):
        await late.rw_lock("starve").read.acquire(timeout=SHORT)
    await writing.release()
    async with late.rw_lock("starve").read:
        pass


async def test_writer_may_read_inside_and_reader_may_not_upgrade(rw_harness: Harness) -> None:
    locks, other = rw_harness.connect(ttl=TTL), rw_harness.connect(ttl=TTL)
    rw = locks.rw_lock("nest")
    async with rw.write as lease:
        async with rw.read as inner:
            assert inner is lease and lease.hold_count == 2
            assert rw.read.held and rw.write.held
        assert not rw.read.held and rw.write.held
        with pytest.raises(LockTimeout):  # still exclusive
            await other.rw_lock("nest").read.acquire(timeout=SHORT)
    async with rw.read:
        with pytest.raises(LockError, match="upgrade"):
            await rw.write.acquire(timeout=SHORT)
        assert rw.read.held
    assert (await rw.write.info()).owner is None
    assert (await rw.read.info()).owner is None


async def test_write_downgrade_keeps_the_write_hold_until_both_are_released(rw_harness: Harness) -> None:
    locks, other = rw_harness.connect(ttl=TTL), rw_harness.connect(ttl=TTL)
    rw = locks.rw_lock("down")
    await rw.write.acquire()
    await rw.read.acquire()
    await rw.write.release()
    assert rw.read.held
    with pytest.raises(LockTimeout):
        await other.rw_lock("down").write.acquire(timeout=SHORT)
    await rw.read.release()
    async with other.rw_lock("down").write:
        pass


async def test_a_reader_that_stops_renewing_frees_the_writers_after_its_ttl(rw_harness: Harness) -> None:
    dead, alive, writer = (rw_harness.connect(ttl=TTL) for _ in range(3))
    await dead.rw_lock("gone").read.acquire()
    async with alive.rw_lock("gone").read:
        await insides.stop_renewing(dead)  # the first reader "dies"; the second releases normally
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with writer.rw_lock("gone").write:
        pass
    assert loop.time() - start <= TTL + scaled(1.0)


# -- semaphore ----------------------------------------------------------------------


async def test_semaphore_never_has_more_holders_than_permits(sem_harness: Harness) -> None:
    clients = [sem_harness.connect(ttl=TTL) for _ in range(6)]
    active: set[int] = set()
    peak = 0
    tokens: list[int | None] = []

    async def use(i: int) -> None:
        nonlocal peak
        for _ in range(3):
            async with clients[i].semaphore("gpu", permits=3) as lease:
                tokens.append(lease.token)
                active.add(i)
                peak = max(peak, len(active))
                assert len(active) <= 3, f"{len(active)} holders of a 3-permit semaphore"
                await asyncio.sleep(random.uniform(0, 0.02))
                active.discard(i)

    await asyncio.wait_for(asyncio.gather(*(use(i) for i in range(6))), scaled(30))
    assert peak >= 2  # they did overlap
    if has_tokens(sem_harness):
        assert len(set(tokens)) == len(tokens), "every permit has its own token"


async def test_semaphore_refuses_the_permit_past_the_count_and_reports_holders(sem_harness: Harness) -> None:
    clients = [sem_harness.connect(ttl=TTL) for _ in range(3)]
    sems = [client.semaphore("three", permits=2) for client in clients]
    await sems[0].acquire(timeout=0)
    await sems[1].acquire(timeout=0)
    with pytest.raises(LockTimeout):
        await sems[2].acquire(timeout=0)
    info = await sems[2].info()
    assert len(info.holders) == 2
    waiting = Holder(sems[2], timeout=scaled(5))
    await asyncio.sleep(0.05)
    assert waiting.lease is None
    await sems[0].release()
    await waiting.release()
    await sems[1].release()


async def test_a_dead_holders_permit_comes_back_after_its_ttl(sem_harness: Harness) -> None:
    dead, alive = sem_harness.connect(ttl=TTL), sem_harness.connect(ttl=TTL)
    first = await dead.semaphore("leak", permits=2).acquire()
    other_task = asyncio.get_running_loop().create_task(_hold_in_task(dead, "leak"))
    second = await other_task
    await insides.stop_renewing(dead)  # both holders "die"
    loop = asyncio.get_running_loop()
    start = loop.time()
    sem = alive.semaphore("leak", permits=2)
    lease = await sem.acquire(timeout=TTL + scaled(2))
    other = await asyncio.get_running_loop().create_task(_hold_in_task(alive, "leak", timeout=scaled(2)))
    assert loop.time() - start <= TTL + scaled(1.5)
    if has_tokens(sem_harness):
        assert lease.token is not None and first.token is not None and second.token is not None
        assert lease.token > max(first.token, second.token)
    assert other is not None
    await sem.release()


async def _hold_in_task(locks: asynclock.Locks, name: str, timeout: float | None = None) -> asynclock.Lease:
    """Acquire a permit owned by a task of its own (a second holder in the same client)."""
    return await locks.semaphore(name, permits=2).acquire(timeout=timeout)


# -- cancellation --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
async def test_cancelling_waiters_of_every_primitive_leaves_nothing(
    rw_harness: Harness, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    backend = request.node.callspec.params["rw_harness"]
    locks = rw_harness.connect(ttl=TTL)
    holders = rw_harness.connect(ttl=TTL)
    handles: list[asynclock.Lock] = [locks.rw_lock("c").read, locks.rw_lock("c").write]
    held: list[asynclock.Lock] = [holders.rw_lock("c").write]
    if backend in SUPPORT["fair"]:
        handles.append(locks.lock("c", fair=True))
        held.append(holders.lock("c", fair=True))
    if backend in SUPPORT["semaphore"]:
        handles.append(locks.semaphore("c", permits=1))
        held.append(holders.semaphore("c", permits=1))
    for lock in held:
        await lock.acquire()
    released = False

    async def use(handle: asynclock.Lock) -> None:
        async with handle:  # cancelled while waiting, inside, or while releasing
            await asyncio.sleep(rng.uniform(0, 0.01))

    for _ in range(6):
        if not released and rng.random() < 0.3:
            for lock in held:
                await lock.release()
            released = True
        tasks = [asyncio.create_task(use(h)) for h in rng.sample(handles, len(handles))]
        await asyncio.sleep(rng.uniform(0, 0.03))
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), results
    if not released:
        for lock in held:
            await lock.release()
    # Everything is free again for somebody else (the harness checks the server too).
    other = rw_harness.connect(ttl=TTL)
    async with other.rw_lock("c").write:
        pass
    if backend in SUPPORT["fair"]:
        async with other.lock("c", fair=True):
            pass
    if backend in SUPPORT["semaphore"]:
        async with other.semaphore("c", permits=1):
            pass


async def test_closing_the_client_ends_a_queued_fair_acquire(fair_harness: Harness) -> None:
    """A fair acquire queued on the server when its client is closed ends with
    BackendUnavailable at once (not when the holder lets go), and leaves the queue."""
    holder, closing = fair_harness.connect(ttl=TTL), fair_harness.connect(ttl=TTL)
    lock = holder.lock("closed-queue", fair=True)
    await lock.acquire()
    waiting = asyncio.create_task(closing.lock("closed-queue", fair=True).acquire())
    await queued(lock, 1)
    await closing.aclose()
    with pytest.raises(asynclock.BackendUnavailable, match="closed"):
        await asyncio.wait_for(waiting, scaled(5))
    await queued(lock, 0)
    await lock.release()


async def test_a_semaphore_asked_for_with_other_permits_is_refused(sem_harness: Harness) -> None:
    """Clients that disagree on ``permits`` would each let their own number in:
    the one that asks with another number than the users' gets ValueError naming
    both, at once (not after waiting), holding and queueing nothing."""
    if sem_harness.kind not in ("memory", "etcd"):
        pytest.skip("checked on this backend in its own test file")
    a = sem_harness.connect(ttl=TTL)
    b = sem_harness.connect(ttl=TTL)
    sem = a.semaphore("gpu", permits=3)
    async with sem:
        with pytest.raises(ValueError, match=r"permits=3.*permits=2"):
            async with asyncio.timeout(scaled(5)):
                await b.semaphore("gpu", permits=2).acquire()
        info = await sem.info()
        assert len(info.holders) == 1 and not info.waiters
        async with a.semaphore("gpu", permits=3), b.semaphore("gpu", permits=3):
            pass
    async with b.semaphore("gpu", permits=2):  # nobody uses it any more: a new number is fine
        pass
