"""The multi-lock (``locks.multi(names)``) on every backend with a server of its own:
all or none, in one canonical order (two multi-locks never deadlock), one
lease whose loss (of any part) cancels the body and releases the rest, and
nothing left held by a timeout or a cancellation at any point of the acquire.
The parts are the plain locks of the names, so single locks of other clients
exclude them. The one-request fast path of a single Redis is one round trip.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import LockLost, LockTimeout, LossReason, NotHeld
from asynclock.abc import AcquiresMany, Busy, LockRef
from tests.conftest import make_harness
from tests.harnesses import Harness, RedisHarness
from tests.servers import RedisServer, scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)
#: The ttl of tests where nothing is meant to expire (a loaded machine must not make it happen).
LONG = scaled(10)

#: Every backend: a multi-lock's parts are the plain lock, which each of them has.
BACKENDS = ["memory", "redis", "postgres", "zookeeper", "etcd", "redlock", "redis+cluster"]


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


async def held_by(client: asynclock.Locks, names: Sequence[str]) -> list[str]:
    """Which of ``names`` the server says ``client`` holds now (asked through ``client``, which
    knows its own hold ids where the server shows another client's by its node's name)."""
    found = []
    for name in names:
        owner = (await client.lock(name).info()).owner
        if owner is not None and owner.startswith(client.client_id):
            found.append(name)
    return found


async def eventually_free_of(client: asynclock.Locks, names: Sequence[str]) -> None:
    """Wait (bounded) until the server says ``client`` holds none of ``names``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while left := await held_by(client, names):
        assert loop.time() < deadline, f"{client!r} still holds {left}"
        await asyncio.sleep(0.01)


# -- all or none, one lease -------------------------------------------------------------


async def test_every_part_is_a_plain_lock_with_its_token(harness: Harness) -> None:
    locks, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    multi = locks.multi(["b", "c", "a", "b"])  # a repeated name counts once
    assert multi.names == ("a", "b", "c")
    assert not multi.held
    async with multi as lease:
        assert multi.held
        assert lease.names == ("a", "b", "c") and set(lease.tokens) == {"a", "b", "c"}
        for name in lease.names:
            info = await locks.lock(name).info()
            assert info.owner is not None and info.owner.startswith(locks.client_id)
            if getattr(harness, "has_tokens", True):
                assert isinstance(lease.tokens[name], int) and lease.tokens[name] == info.token
            assert lease.parts[name].token == lease.tokens[name]
        # the single lock of a part's name, of another client, is excluded
        with pytest.raises(LockTimeout):
            await other.lock("b").acquire(timeout=0)
        assert not lease.lost and lease.remaining > 0
    assert not multi.held
    assert await held_by(locks, ["a", "b", "c"]) == []
    with pytest.raises(NotHeld):
        await multi.release()
    with pytest.raises(NotHeld):
        await lease.release()


async def test_a_part_held_elsewhere_times_out_holding_none(harness: Harness) -> None:
    locks, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    names = ["a", "b", "c"]
    blocker = await other.lock("b").acquire()
    for timeout in (0, SHORT):
        with pytest.raises(LockTimeout) as caught:
            await locks.multi(names).acquire(timeout=timeout)
        assert caught.value.name == "b" and caught.value.timeout == timeout
        assert await held_by(locks, names) == [], "the parts taken before 'b' were not given back"
        assert await held_by(other, names) == ["b"]
        assert not blocker.lost
    # and with "b" free again, the same multi-lock is had at once
    await other.lock("b").release()
    async with locks.multi(names).acquire(timeout=scaled(5)) as lease:
        assert lease.names == tuple(names)


async def test_two_multi_locks_in_opposite_orders_never_deadlock(harness: Harness) -> None:
    first, second = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    inside: list[str] = []
    rounds = 40

    async def worker(locks: asynclock.Locks, names: list[str], me: str) -> int:
        done = 0
        for _ in range(rounds):
            async with locks.multi(names) as lease:
                assert lease.names == ("a", "b")
                inside.append(me)
                assert len(inside) == 1, f"both inside at once: {inside}"
                await asyncio.sleep(0)
                inside.remove(me)
            done += 1
        return done

    # A deadlock would wait for ever: the bound fails it instead.
    async with asyncio.timeout(scaled(60)):
        counts = await asyncio.gather(worker(first, ["a", "b"], "first"), worker(second, ["b", "a"], "second"))
    assert counts == [rounds, rounds]


async def test_a_multi_lock_and_single_locks_of_its_names_exclude_each_other(harness: Harness) -> None:
    locks, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    single = await other.lock("y").acquire()
    got: list[asynclock.MultiLease] = []

    async def take() -> None:
        async with locks.multi(["x", "y", "z"]) as lease:
            got.append(lease)

    waiter = asyncio.create_task(take())
    await asyncio.sleep(SHORT)
    assert not got and not waiter.done(), "the multi-lock got a part held by a single lock"
    await single.release()
    async with asyncio.timeout(scaled(10)):
        await waiter
    assert got and got[0].names == ("x", "y", "z")


# -- loss -----------------------------------------------------------------------------


async def test_losing_one_part_cancels_the_body_and_releases_the_rest(harness: Harness) -> None:
    locks, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    names = ["p", "q", "r"]
    reached_end = False
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(scaled(20)):
            async with locks.multi(names) as lease:
                assert await harness.expire("q")
                await lease.wait_lost()  # (the body would be cancelled here at the latest)
                await asyncio.sleep(scaled(20))
                reached_end = True
    assert not reached_end
    assert lease.lost and caught.value.name in names
    if harness.kind != "postgres":  # (there the parts may share the session the harness ended)
        assert caught.value.name == "q"
        assert caught.value.loss is LossReason.TAKEN_OR_EXPIRED
    await eventually_free_of(locks, names)
    async with other.multi(names).acquire(timeout=scaled(5)):
        pass


async def test_losing_a_part_of_a_lease_without_a_body_releases_the_rest(harness: Harness) -> None:
    locks, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    multi = locks.multi(["m", "n"])
    lease = await multi.acquire()
    assert await harness.expire("n")
    async with asyncio.timeout(scaled(10)):
        reason = await lease.wait_lost()
    assert reason and lease.lost and not multi.held
    await eventually_free_of(locks, ["m", "n"])
    with pytest.raises(NotHeld):
        await multi.release()
    async with other.multi(["m", "n"]).acquire(timeout=scaled(5)):
        pass


async def test_max_hold_ends_the_whole(harness: Harness) -> None:
    locks, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    with pytest.raises(LockLost) as caught:
        async with asyncio.timeout(scaled(20)):
            async with locks.multi(["h1", "h2"], max_hold=SHORT):
                await asyncio.sleep(scaled(20))
    assert caught.value.loss is LossReason.MAX_HOLD and caught.value.reason == "max_hold"
    await eventually_free_of(locks, ["h1", "h2"])
    async with other.multi(["h1", "h2"]).acquire(timeout=scaled(5)):
        pass


async def test_closing_the_client_ends_a_multi_lock_body(harness: Harness) -> None:
    locks, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    entered = asyncio.Event()

    async def body() -> None:
        async with locks.multi(["c1", "c2"]):
            entered.set()
            await asyncio.sleep(scaled(20))

    task = asyncio.create_task(body())
    async with asyncio.timeout(scaled(5)):
        await entered.wait()
    await locks.aclose()
    with pytest.raises(LockLost):
        async with asyncio.timeout(scaled(5)):
            await task
    async with other.multi(["c1", "c2"]).acquire(timeout=scaled(5)):
        pass
    # a task that closes its client inside its own block is not cut short by its close
    closer = harness.connect(ttl=LONG)
    closed = False
    with pytest.raises(LockLost):
        async with closer.multi(["c1", "c2"]):
            await closer.aclose()
            closed = True
    assert closed
    async with other.multi(["c1", "c2"]).acquire(timeout=scaled(5)):
        pass


async def test_a_failing_renewal_of_a_part_puts_the_whole_at_risk() -> None:
    from asynclock.testing import faults

    async with asynclock.connect("memory://", ttl=TTL, prefix="risk") as locks:
        async with locks.multi(["r1", "r2"]) as lease:
            assert not lease.at_risk
            with faults(locks).unavailable():
                async with asyncio.timeout(TTL):
                    reason = await lease.wait_at_risk()
                assert reason and lease.at_risk and not lease.lost
            async with asyncio.timeout(TTL):
                while lease.at_risk:  # the next renewal succeeds again
                    await asyncio.sleep(0.01)
            assert not lease.lost


# -- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(2))
async def test_cancelling_at_any_point_of_the_acquire_leaves_nothing_held(harness: Harness, seed: int) -> None:
    """Cancelled after 0, 1, 2, … loop turns (every await of the acquire on the way: the
    all-or-none try, each part's try, the wait for a part held elsewhere, the give-back).
    The cancelled task lives on and looks: what it holds then is held for real (a
    task that ended would have its holds released as abandoned, hiding a leak)."""
    rng = random.Random(seed)
    locks, other = harness.connect(ttl=LONG), harness.connect(ttl=LONG)
    names = ["k1", "k2", "k3"]
    blocked = seed % 2 == 1  # a part held elsewhere: the acquire waits for it, holding the others
    if blocked:
        await other.lock("k3").acquire()

    async def attempt(detached: bool, box: list[asynclock.MultiLease | None], looked: asyncio.Event) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            box.append(await locks.multi(names).acquire(detached=detached))
        except asyncio.CancelledError:
            task.uncancel()
            box.append(None)
        while not looked.is_set():  # alive (nothing abandoned) until the test has looked
            try:
                await looked.wait()
            except asyncio.CancelledError:
                task.uncancel()

    outcomes = set()
    for turns in range(40):
        box: list[asynclock.MultiLease | None] = []
        looked = asyncio.Event()
        task = asyncio.create_task(attempt(rng.random() < 0.3, box, looked))
        await asyncio.sleep(0)  # (it starts: into the acquire's first request)
        for _ in range(turns):
            await asyncio.sleep(0)
        if rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0, 0.005))
        task.cancel()
        while not box:
            await asyncio.sleep(0.001)
        lease = box[0]
        try:
            if lease is not None:
                assert await held_by(locks, names) == names, f"after {turns} turns"
            else:
                # given back (a give-back that outlasts a request window, on a loaded
                # machine, goes on in the background: a leak would stay for good)
                await eventually_free_of(locks, names)
            outcomes.add(lease is not None)
            if lease is not None:
                await lease.release()
        finally:
            looked.set()
            await task
        if blocked:
            assert await held_by(other, names) == ["k3"]
    assert not blocked or outcomes == {False}
    if blocked:
        await other.lock("k3").release()
    async with other.multi(names).acquire(timeout=scaled(5)):
        pass


# -- the handle -------------------------------------------------------------------------


async def test_the_handle_behaves_like_a_lock(harness: Harness) -> None:
    locks = harness.connect(ttl=LONG)
    with pytest.raises(TypeError):
        locks.multi("ab")
    with pytest.raises(TypeError):
        locks.multi(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        locks.multi([])
    with pytest.raises(ValueError):
        locks.multi(["a"], max_hold=-1)
    multi = locks.multi(["e", "f"])
    with pytest.raises(TypeError):
        with multi:  # type: ignore[attr-defined]
            pass
    with pytest.raises(TypeError):
        await multi  # type: ignore[misc]
    # re-entry: the same task again, then released as many times
    first = await multi.acquire()
    assert await multi.acquire() is first and first.hold_count == 2
    await multi.release()
    assert multi.held
    await multi.release()
    assert not multi.held
    # a part the task holds as a single lock is re-entered, not waited for
    single = locks.lock("f")
    async with single:
        async with asyncio.timeout(scaled(5)):
            async with multi:
                assert single.held
        assert single.held, "the multi-lock's release took the task's own single hold"
        assert (await single.info()).owner is not None
    assert (await single.info()).owner is None
    # overlapping multi-locks of one task share the common part (re-entered)
    async with asyncio.timeout(scaled(5)):
        async with multi as outer:
            async with locks.multi(["f", "g"]) as inner:
                assert outer.parts["f"] is inner.parts["f"] and inner.parts["f"].hold_count == 2
            assert (await locks.lock("g").info()).owner is None
            assert locks.lock("f").held and outer.parts["f"].hold_count == 1
    assert (await locks.lock("f").info()).owner is None
    # detached: owned by no task, released from anywhere
    lease = await multi.acquire(detached=True)
    assert not multi.held
    await asyncio.create_task(lease.release())
    assert (await locks.lock("e").info()).owner is None


# -- the one-request fast path ------------------------------------------------------------


async def test_redis_takes_free_parts_in_one_round_trip(redis_fresh: RedisServer) -> None:
    async with RedisHarness(redis_fresh) as harness:
        admin = aioredis.Redis.from_url(redis_fresh.url)
        try:
            locks = harness.connect(ttl=scaled(30))
            await locks.open()
            multi = locks.multi([f"n{i}" for i in range(5)])
            async with locks.multi(["warm", "up"]):  # (the script is loaded on its first use)
                pass
            await admin.config_resetstat()
            lease = await multi.acquire()
            stats = await admin.info("commandstats")
            calls = {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}
            calls.pop("config|resetstat", None)
            # One request: one script call (the server counts the commands it runs inside too).
            assert calls.pop("evalsha") == 1, calls
            assert set(calls) <= {"get", "exists", "time", "set"}, calls
            assert calls["set"] == 5, calls
            # each part is an ordinary plain lock: another client's single lock is refused
            other = harness.connect(ttl=scaled(30))
            with pytest.raises(LockTimeout):
                await other.lock("n3").acquire(timeout=0)
            for name, token in lease.tokens.items():
                assert (await locks.lock(name).info()).token == token
            await multi.release()
            assert await held_by(locks, multi.names) == []
        finally:
            await admin.aclose()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_the_one_request_try_takes_none_when_one_part_is_taken(kind: str, request: pytest.FixtureRequest) -> None:
    """The backend's all-or-none request: with one part taken it takes nothing (and
    then a multi-lock goes on part by part); with every part free it takes them all."""
    async with make_harness(request, kind) as harness:
        locks, other = harness.connect(ttl=scaled(30)), harness.connect(ttl=scaled(30))
        await locks.open()
        backend = locks.backend
        assert isinstance(backend, AcquiresMany)
        refs = [LockRef("lock", name) for name in ("n1", "n2", "n3")]
        assert backend.acquires_many(refs)
        assert not backend.acquires_many([*refs, LockRef("semaphore", "n4", 2)])
        await other.lock("n2").acquire()
        holds = [f"{locks.client_id}:test:{i}" for i in range(3)]
        answer = await backend.try_acquire_many(refs, holds, scaled(30))
        assert isinstance(answer, Busy)
        assert answer.retry_after is None or 0 < answer.retry_after <= scaled(30)
        for name in ("n1", "n3"):
            assert (await locks.lock(name).info()).owner is None, f"{name} was taken by a refused try"
        await other.lock("n2").release()
        answer = await backend.try_acquire_many(refs, holds, scaled(30))
        assert isinstance(answer, list) and len(answer) == 3
        again = await backend.try_acquire_many(refs, holds, scaled(30))  # a retry of the same holds
        assert isinstance(again, list) and [a.token for a in again] == [a.token for a in answer]
        for ref, hold, acquired in zip(refs, holds, answer, strict=True):
            info = await locks.lock(ref.name).info()
            assert info.owner == hold and info.token == acquired.token
            assert await backend.release(ref, hold)
