"""Interleavings of the fair lock, read-write lock and semaphore that the
other suites do not try: loss under a joined read, cancellation at each step
of a queued acquire, timeouts racing a hand-over, clients with different
views of one name, one primitive's renewals failing or hanging among others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

import asynclock
from asynclock import LockLost, LockTimeout
from asynclock.abc import RenewItem
from tests.conftest import make_harness
from tests.harnesses import (
    Harness,
    drop_memory_holder,
    eventually,
    handovers_dropped,
    insides,
    redis_exclusive,
    redis_shared,
)
from tests.servers import scaled
from tests.test_primitives import FAIR_IS_PLAIN

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)


def make_harness_memory() -> Harness:
    from tests.harnesses import MemoryHarness

    return MemoryHarness()


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


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


@pytest.fixture(params=FAIR_IS_PLAIN)
async def same_lock_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


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
    await _queued(held[0], 2)
    await _queued(held[1], 1)
    await _queued(held[2], 1)
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
    await eventually(lambda: len(leases) >= 3, scaled(5), "3 holders")
    victim = leases[0]
    if harness.kind == "memory":
        drop_memory_holder(harness.prefix, "semaphore", "loss", insides.hold_of(victim))
    else:
        admin = harness.admin  # type: ignore[attr-defined]
        base = f"{harness.prefix}:{{loss}}:sem"
        assert await admin.zrem(base, insides.hold_of(victim)) == 1
        await admin.hdel(f"{base}:data", insides.hold_of(victim))
    await asyncio.wait_for(victim.wait_lost(), scaled(5))
    await asyncio.sleep(2 * TTL)  # several renewals of the others
    assert not leases[1].lost and not leases[2].lost
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(map(type, results), key=str) == sorted([LockLost, type(None), type(None)], key=str), results
    assert lost == [victim]


def replace_renewals(
    monkeypatch: pytest.MonkeyPatch,
    locks: asynclock.Locks,
    kind: str,
    renew: Callable[[Sequence[RenewItem]], Awaitable[Sequence[bool | BaseException]]],
) -> None:
    """Make the renewals of the primitive ``kind`` go to ``renew`` (a broken or stuck
    server connection of that primitive); the others' go to the backend as before."""
    backend = locks.backend
    original = backend.renew

    async def routed(items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        if any(item.ref.kind == kind for item in items):
            return await renew(items)
        return await original(items)

    monkeypatch.setattr(backend, "renew", routed)


async def test_one_adapters_failing_renewals_do_not_lose_the_other_shapes_leases(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = harness.connect(ttl=TTL)
    plain, fair, sem = locks.lock("group"), locks.lock("group", fair=True), locks.semaphore("group", permits=2)
    p, f, s = await plain.acquire(), await fair.acquire(), await sem.acquire()

    async def broken(items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        raise ConnectionError("the semaphore's server connection is down")

    replace_renewals(monkeypatch, locks, "semaphore", broken)
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


async def test_info_of_each_shape_lists_holders_and_counts_waiters(any_harness: Harness) -> None:
    a, b = any_harness.connect(ttl=TTL), any_harness.connect(ttl=TTL)
    leases: list[asynclock.Lease] = []
    stop = asyncio.Event()

    async def hold(lock: asynclock.Lock) -> None:
        async with lock as lease:
            leases.append(lease)
            await stop.wait()

    readers = [asyncio.create_task(hold(c.rw_lock("see").read)) for c in (a, b)]
    permits = [asyncio.create_task(hold(c.semaphore("see", permits=2))) for c in (a, b)]
    fair = [asyncio.create_task(hold(a.lock("see", fair=True)))]
    await eventually(lambda: len(leases) >= 5, scaled(5), "5 holders")
    waiting = [
        asyncio.create_task(b.rw_lock("see").write.acquire()),
        asyncio.create_task(b.semaphore("see", permits=2).acquire()),
        asyncio.create_task(b.lock("see", fair=True).acquire()),
    ]
    await asyncio.sleep(scaled(0.3))
    tokens = {lease.token for lease in leases}
    for lock, holders in (
        (a.rw_lock("see").read, 2),
        (a.rw_lock("see").write, 2),
        (a.semaphore("see", permits=2), 2),
        (a.lock("see", fair=True), 1),
    ):
        info = await lock.info()
        assert info.held and len(info.holders) == holders and info.owner in info.holders, (lock, info)
        assert info.token in tokens, (lock, info)
        assert info.waiters in (None, 1), (lock, info)
    for task in waiting:
        task.cancel()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    stop.set()
    await asyncio.wait_for(asyncio.gather(*readers, *permits, *fair), scaled(5))


@pytest.mark.parametrize("kind", ["fair", "write", "semaphore"])
async def test_two_tasks_of_one_client_and_another_client_queue_in_order(any_harness: Harness, kind: str) -> None:
    holder, a, b = (any_harness.connect(ttl=TTL) for _ in range(3))
    held = _shaped(holder, kind, "order")
    await held.acquire()
    order: list[str] = []

    async def wait(locks: asynclock.Locks, tag: str) -> None:
        async with _shaped(locks, kind, "order"):
            order.append(tag)
            await asyncio.sleep(0.005)

    tasks = []
    for count, (locks, tag) in enumerate(((a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")), start=1):
        tasks.append(asyncio.create_task(wait(locks, tag)))
        await _queued(held, count)  # each reaches the server before the next starts
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(10))
    assert order == ["a1", "b1", "a2", "b2"]


@pytest.fixture
async def redis_own(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    from tests.harnesses import RedisHarness

    async with RedisHarness(request.getfixturevalue("redis_fresh")) as h:
        yield h


async def test_script_cache_flushed_while_acquires_are_queued(redis_own: Harness) -> None:
    holder, waiter = redis_own.connect(ttl=TTL), redis_own.connect(ttl=TTL)
    admin = redis_own.admin  # type: ignore[attr-defined]
    held = [holder.lock("flush", fair=True), holder.rw_lock("flush").write, holder.semaphore("flush", permits=1)]
    for lock in held:
        await lock.acquire()
    got: list[asynclock.Lease] = []

    async def wait(lock: asynclock.Lock) -> None:
        async with lock as lease:
            got.append(lease)

    tasks = [
        asyncio.create_task(wait(lock))
        for lock in (
            waiter.lock("flush", fair=True),
            waiter.rw_lock("flush").read,
            waiter.semaphore("flush", permits=1),
        )
    ]
    await _queued(held[0], 1)
    await _queued(held[1], 1)
    await _queued(held[2], 1)
    await admin.script_flush()
    await asyncio.sleep(TTL / 2)  # the waiters poll (NOSCRIPT: loaded again) and stay queued
    await admin.script_flush()
    for lock in held:
        await lock.release()  # each release hands over (NOSCRIPT: loaded again)
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(5))
    assert len(got) == 3


async def test_a_waiter_cancelled_after_an_unseen_hand_over_passes_it_on_at_once(redis_own: Harness) -> None:

    holder, first, second = (redis_own.connect(ttl=scaled(3.0)) for _ in range(3))
    lock = holder.lock("pass", fair=True)
    await lock.acquire()
    one = asyncio.create_task(first.lock("pass", fair=True).acquire())
    await _queued(lock, 1)
    two = asyncio.create_task(second.lock("pass", fair=True).acquire())
    await _queued(lock, 2)
    with handovers_dropped(first):  # the hand-over message is lost
        await lock.release()  # handed to ``first``, which does not know yet (its next poll is ttl/3 away)
        info = await lock.info()
        assert info.owner is not None and info.owner.startswith(first.client_id)
        one.cancel()
        with pytest.raises(asyncio.CancelledError):
            await one
        # The cancelled waiter gave the lock back, which handed it to ``second`` at once
        # (well before the 3 s hold handed to ``first`` would have expired).
        lease = await asyncio.wait_for(two, scaled(1.0))
        assert lease.token is not None


@pytest.mark.parametrize("seed", [1, 2])
async def test_permits_and_exclusion_hold_under_timeouts_and_cancellations(any_harness: Harness, seed: int) -> None:
    """Many acquires on three clients, each with a random timeout, some cancelled at a
    random moment (queued, just granted, inside, releasing): a 2-permit semaphore
    never has three holders, a writer never overlaps anybody, a fair lock has one
    holder; afterwards each is free."""
    import random

    rng = random.Random(seed)
    clients = [any_harness.connect(ttl=TTL) for _ in range(3)]
    active = {"sem": 0, "read": 0, "write": 0, "fair": 0}
    worst = {"sem": 0, "fair": 0}
    overlap: list[str] = []

    def handle(locks: asynclock.Locks, what: str) -> asynclock.Lock:
        if what == "sem":
            return locks.semaphore("storm", permits=2)
        if what == "fair":
            return locks.lock("storm", fair=True)
        rw = locks.rw_lock("storm")
        return rw.read if what == "read" else rw.write

    async def use(locks: asynclock.Locks, what: str) -> None:
        try:
            lock = handle(locks, what)
            await lock.acquire(timeout=rng.choice([0, 0.01, 0.05, None]))
        except LockTimeout:
            return
        try:
            active[what] += 1
            if what in worst:
                worst[what] = max(worst[what], active[what])
            if active["write"] and (active["read"] or active["write"] > 1):
                overlap.append(f"{active}")
            await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            active[what] -= 1
            await lock.release()

    for _ in range(5):
        tasks = [
            asyncio.create_task(use(rng.choice(clients), rng.choice(["sem", "read", "write", "fair"])))
            for _ in range(10)
        ]
        await asyncio.sleep(rng.uniform(0, 0.03))
        for task in rng.sample(tasks, 4):
            task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), scaled(20))
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), results
    assert worst["sem"] <= 2 and worst["fair"] <= 1 and not overlap, (worst, overlap)
    probe = any_harness.connect(ttl=TTL)
    for what in ("sem", "write", "fair"):
        lock = handle(probe, what)
        await lock.acquire(timeout=scaled(1.0))
        await lock.release()


async def test_readers_queued_behind_a_writer_enter_together_up_to_the_next_writer(any_harness: Harness) -> None:
    holder = any_harness.connect(ttl=TTL)
    clients = [any_harness.connect(ttl=TTL) for _ in range(4)]
    write = holder.rw_lock("phases").write
    first = await write.acquire()
    inside: set[str] = set()
    seen: list[set[str]] = []
    leave = {tag: asyncio.Event() for tag in ("r1", "r2", "w2", "r3")}
    tokens: dict[str, int | None] = {}

    async def use(locks: asynclock.Locks, tag: str) -> None:
        rw = locks.rw_lock("phases")
        async with rw.write if tag.startswith("w") else rw.read as lease:
            tokens[tag] = lease.token
            inside.add(tag)
            seen.append(set(inside))
            await leave[tag].wait()
            inside.discard(tag)

    tasks = []
    for count, (locks, tag) in enumerate(zip(clients, ("r1", "r2", "w2", "r3"), strict=True), start=1):
        tasks.append(asyncio.create_task(use(locks, tag)))
        await _queued(write, count)
    await write.release()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while inside != {"r1", "r2"}:
        assert loop.time() < deadline, inside
        await asyncio.sleep(0.01)
    await asyncio.sleep(scaled(0.1))
    assert inside == {"r1", "r2"}  # r3 stays behind the queued writer
    leave["r1"].set()
    leave["r2"].set()
    while inside != {"w2"}:
        assert loop.time() < deadline + scaled(5), inside
        await asyncio.sleep(0.01)
    leave["w2"].set()
    leave["r3"].set()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(5))
    assert all(len(s) <= 2 and ("w2" not in s or s == {"w2"}) for s in seen), seen
    if first.token is not None:  # one counter for both sides, increasing phase by phase
        r1, r2, w2, r3 = (tokens[tag] or 0 for tag in ("r1", "r2", "w2", "r3"))
        assert first.token < min(r1, r2) and max(r1, r2) < w2 < r3, (first.token, tokens)


async def test_every_permit_has_its_own_increasing_token(any_harness: Harness) -> None:
    a, b = any_harness.connect(ttl=TTL), any_harness.connect(ttl=TTL)
    first = await a.semaphore("tok", permits=2).acquire()
    second = await b.semaphore("tok", permits=2).acquire()
    if first.token is None:
        pytest.skip("no fencing tokens on this backend")
    assert second.token is not None and second.token > first.token
    await a.semaphore("tok", permits=2).release()
    third = await a.semaphore("tok", permits=2).acquire()
    assert third.token is not None and third.token > second.token
    await a.semaphore("tok", permits=2).release()
    await b.semaphore("tok", permits=2).release()


async def test_a_hanging_renewal_of_one_shape_does_not_lose_the_short_leases_of_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal call that hangs (a stuck connection of the semaphore's adapter)
    must not hold up the renewals of other adapters' leases: the plain lock with
    a short ttl keeps being renewed while the semaphore's call waits."""
    async with make_harness_memory() as harness:
        locks = harness.connect(ttl=TTL)
        plain = locks.lock("hang", ttl=SHORT)
        sem = locks.semaphore("hang", permits=1, ttl=scaled(3.0))
        s = await sem.acquire()
        p = await plain.acquire()
        calls = 0

        async def stuck(items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
            nonlocal calls
            calls += 1
            await asyncio.sleep(scaled(30))
            raise AssertionError("unreachable")

        replace_renewals(monkeypatch, locks, "semaphore", stuck)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(5)
        while calls == 0:  # the semaphore's first renewal is under way (and hangs)
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(4 * SHORT)  # many periods of the plain lock's lease
        assert not p.lost, p.lost_reason
        await plain.release()
        monkeypatch.undo()
        assert s is not None


async def test_each_primitive_of_a_name_is_its_own_resource(any_harness: Harness) -> None:
    """The plain lock "x", the write side of "x" and the semaphore "x" do not exclude
    each other (nor the fair lock "x", where it is not the plain lock itself)."""
    clients = [any_harness.connect(ttl=TTL) for _ in range(4)]
    handles: list[asynclock.Lock] = [
        clients[0].lock("own"),
        clients[1].rw_lock("own").write,
        clients[2].semaphore("own", permits=1),
    ]
    if any_harness.kind == "memory":  # (on Redis, ZooKeeper, PostgreSQL it is the plain lock)
        handles.append(clients[3].lock("own", fair=True))
    for lock in handles:
        await lock.acquire(timeout=0)
    for lock in handles:
        await lock.release()


async def test_a_read_joins_the_write_through_another_handle_of_the_name(any_harness: Harness) -> None:
    locks, other = any_harness.connect(ttl=TTL), any_harness.connect(ttl=TTL)
    async with locks.rw_lock("handles").write as lease:
        async with locks.rw_lock("handles", ttl=scaled(1.0)).read as inner:
            assert inner is lease and lease.hold_count == 2
        with pytest.raises(LockTimeout):
            await other.rw_lock("handles").read.acquire(timeout=0)
    async with other.rw_lock("handles").write:
        pass


async def test_a_handed_over_hold_that_expires_is_lost_and_passed_on(harness: Harness) -> None:
    holder, waiter, third = (harness.connect(ttl=TTL) for _ in range(3))
    lock = holder.lock("handed", fair=True)
    await lock.acquire()
    got = asyncio.Event()
    outcome: list[BaseException | None] = []

    async def wait() -> None:
        try:
            async with waiter.lock("handed", fair=True):
                got.set()
                await asyncio.sleep(scaled(10))
        except LockLost as exc:
            outcome.append(exc)

    task = asyncio.create_task(wait())
    await _queued(lock, 1)
    await lock.release()  # handed over
    await asyncio.wait_for(got.wait(), scaled(5))
    assert await harness.expire_shape("fair", "handed")
    await asyncio.wait_for(task, scaled(5))
    assert len(outcome) == 1
    async with third.lock("handed", fair=True):
        pass


@pytest.mark.parametrize("at_call", [1, 2])
@pytest.mark.parametrize("kind", ["fair", "write", "semaphore"])
async def test_cancelled_right_after_the_server_queued_or_polled_leaves_the_queue(
    redis_own: Harness, monkeypatch: pytest.MonkeyPatch, at_call: int, kind: str
) -> None:
    """The waiter's request (its first, or a poll) has been applied by the server,
    and the waiter is cancelled before it reads the answer: its entry is gone and
    the next release reaches the waiter behind it."""
    from asynclock.backends.redis._exclusive import ExclusiveLock
    from asynclock.backends.redis._queue import Entered
    from asynclock.backends.redis._shared import QueuedResource

    holder, cancelled, behind = (redis_own.connect(ttl=TTL) for _ in range(3))
    held = _shaped(holder, kind, "applied")
    await held.acquire()
    applied = asyncio.Event()
    calls = 0
    queue = ExclusiveLock if kind == "fair" else QueuedResource
    original = queue.enter

    async def enter(self: Any, *args: Any, **kwargs: Any) -> Entered:
        nonlocal calls
        answer = await original(self, *args, **kwargs)
        if self is victim:
            calls += 1
            if calls == at_call:
                applied.set()
                await asyncio.sleep(scaled(30))  # the answer is never read: cancelled here
        return answer

    victim_lock = _shaped(cancelled, kind, "applied")
    await insides.start(cancelled)
    victim = redis_exclusive(cancelled) if kind == "fair" else redis_shared(cancelled)
    monkeypatch.setattr(queue, "enter", enter)
    task = asyncio.create_task(victim_lock.acquire())
    await asyncio.wait_for(applied.wait(), scaled(5))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _queued(held, 0)
    follower = asyncio.create_task(_shaped(behind, kind, "applied").acquire())
    await _queued(held, 1)
    await held.release()
    lease = await asyncio.wait_for(follower, scaled(2))
    assert lease.token is not None
    assert (await held.info()).waiters == 0


async def test_one_stuck_hold_does_not_lose_the_other_holds_renewed_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    async with make_harness_memory() as harness:
        locks = harness.connect(ttl=TTL)
        sem = locks.semaphore("stuck", permits=2)
        leases: list[asynclock.Lease] = []
        stop = asyncio.Event()

        async def hold() -> None:
            leases.append(await sem.acquire())
            await stop.wait()
            with contextlib.suppress(asynclock.NotHeld):
                await sem.release()

        tasks = [asyncio.create_task(hold()) for _ in range(2)]
        await eventually(lambda: len(leases) >= 2, scaled(5), "2 holders")
        stuck_hold = leases[0]._hold
        real = locks.backend.renew

        async def renew(items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
            if any(item.hold == stuck_hold for item in items):
                await asyncio.sleep(scaled(30))  # this hold's connection hangs
            return await real(items)

        monkeypatch.setattr(locks.backend, "renew", renew)
        await asyncio.wait_for(leases[0].wait_lost(), scaled(5))
        await asyncio.sleep(TTL)
        assert not leases[1].lost, leases[1].lost_reason
        stop.set()
        await asyncio.gather(*tasks)


async def test_a_hold_taken_through_the_fair_handle_is_the_plain_locks_hold_where_they_are_one(
    same_lock_harness: Harness,
) -> None:
    locks, other = same_lock_harness.connect(ttl=TTL), same_lock_harness.connect(ttl=TTL)
    plain, fair = locks.lock("one"), locks.lock("one", fair=True)
    lease = await fair.acquire()
    assert plain.held and fair.held
    assert await plain.acquire(timeout=0) is lease and lease.hold_count == 2
    await plain.release()
    assert fair.held and lease.hold_count == 1
    with pytest.raises(LockTimeout):
        await other.lock("one").acquire(timeout=0)
    await plain.release()  # either handle releases the one hold
    assert not fair.held
    async with other.lock("one"):
        pass
