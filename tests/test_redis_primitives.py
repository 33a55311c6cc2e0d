"""The fair lock, read-write lock and semaphore on real redis-servers: what
only Redis can show (hand-over without a herd, lost pub/sub messages, dead
waiters and SIGKILLed holders in other processes, server-time queue entries).
The generic semantics run in ``test_primitives.py`` and the lock contract in
``test_shapes.py``."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import LockTimeout
from asynclock._timing import drift
from asynclock.abc import LockRef, RenewItem
from asynclock.backends.redis import RedisBackend
from asynclock.backends.redis._connection import ms
from tests.child import ChildProcess, children
from tests.harnesses import (
    RedisHarness,
    handovers_dropped,
    redis_exclusive,
    redis_listener,
    redis_shared,
)
from tests.servers import RedisServer, scaled
from tests.servers.redis_topologies import SentinelSetup
from tests.test_primitives import Holder

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Long enough that no waiter polls (every ttl/3) while a test counts commands.
LONG = scaled(30.0)

#: A holder in a process of its own: acquires, says so, then holds until killed
#: (or, with "release", appends its number to a list and releases at once).
CHILD = r"""
import asyncio, sys
import asynclock
import redis.asyncio as aioredis

async def main(url, prefix, kind, name, ttl, tag, then):
    async with asynclock.connect(url, prefix=prefix, ttl=float(ttl)) as locks:
        if kind == "fair":
            handle = locks.lock(name, fair=True)
        elif kind == "sem":
            handle = locks.semaphore(name, permits=2)
        else:
            handle = locks.rw_lock(name).write
        print("started", flush=True)
        lease = await handle.acquire()
        if then == "release":
            admin = aioredis.Redis.from_url(url)
            await admin.rpush(prefix + ":order", tag)
            await admin.aclose()
            await handle.release()
            return
        print("held", lease.token, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


class Child(ChildProcess):
    """A child Python process holding (or queueing for) a primitive."""

    @classmethod
    async def start(cls, url: str, prefix: str, kind: str, name: str, ttl: float, tag: str, then: str) -> Child:
        return await cls.spawn(CHILD, url, prefix, kind, name, str(ttl), tag, then)


@pytest.fixture
async def admin(redis_fresh: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_fresh.url)
    yield client
    await client.aclose()


@pytest.fixture
async def fresh(redis_fresh: RedisServer) -> AsyncIterator[RedisHarness]:
    """A harness (fresh prefix, nothing left behind checked at the end) on a server of the test's own."""
    async with RedisHarness(redis_fresh) as h:
        yield h


@pytest.fixture
async def shared(redis_server: RedisServer) -> AsyncIterator[RedisHarness]:
    async with RedisHarness(redis_server) as h:
        yield h


async def waiters(lock: asynclock.Lock, count: int, *, at_least: bool = False) -> None:
    """Wait (bounded) until the server reports ``count`` (or more) live queue entries on ``lock``."""
    async with asyncio.timeout(scaled(20)):
        while True:
            found = (await lock.info()).waiters
            assert found is not None
            if found == count or (at_least and found > count):
                return
            await asyncio.sleep(0.01)


async def commandstats(admin: aioredis.Redis) -> dict[str, int]:
    stats = await admin.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


async def queue_entries(admin: aioredis.Redis, lock: asynclock.Lock) -> dict[str, int]:
    """The plain or fair lock's queue: each queued hold and its entry's server-time deadline (ms)."""
    entries = await admin.lrange(f"{lock.key}:q", 0, -1)
    return {entry.decode().rpartition(" ")[2]: int(entry.split()[0]) for entry in entries}


# -- fair lock ----------------------------------------------------------------------


async def test_fifo_across_processes(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    holder = fresh.connect(ttl=LONG)
    lock = holder.lock("fifo", fair=True)
    await lock.acquire()
    async with children() as started:
        for i in range(3):
            started.append(await Child.start(fresh.url, fresh.prefix, "fair", "fifo", LONG, str(i), "release"))
            await waiters(lock, i + 1)  # this child reached the server before the next one starts
        await lock.release()
        for child in started:
            assert await child.wait() == 0
    assert await admin.lrange(f"{fresh.prefix}:order", 0, -1) == [b"0", b"1", b"2"]
    await admin.delete(f"{fresh.prefix}:order")


async def _handoffs(harness: RedisHarness, admin: aioredis.Redis, name: str, count: int) -> dict[str, int]:
    """``count`` waiters (each its own client) behind one holder; the commands the chain of releases costs."""
    holder = harness.connect(ttl=LONG)
    lock = holder.lock(name, fair=True)
    await lock.acquire()
    clients = [harness.connect(ttl=LONG) for _ in range(count)]
    order: list[int] = []

    async def wait(i: int) -> None:
        async with clients[i].lock(name, fair=True):
            order.append(i)

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(wait(i)))
        await waiters(lock, i + 1)
    await admin.config_resetstat()
    await lock.release()
    async with asyncio.timeout(scaled(20)):
        await asyncio.gather(*tasks)
    stats = await commandstats(admin)
    assert order == list(range(count))
    for client in clients:
        await client.aclose()
    return stats


async def test_a_release_wakes_only_the_head_waiter(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    few = await _handoffs(fresh, admin, "few", 2)
    many = await _handoffs(fresh, admin, "many", 12)
    # One message per hand-over, to the one client whose waiter got the lock;
    # every waiter's acquire cost one script call and its release another, so
    # the server work per hand-over does not grow with the number of waiters
    # (a poll of a waiter is the only other request; with LONG ttls there is
    # none while the chain runs, and the slack below allows one per waiter).
    for stats, count in ((few, 2), (many, 12)):
        assert stats.get("publish", 0) == count, stats
        assert stats.get("evalsha", 0) <= (2 * count + 1) + count, stats
    per_handoff_few = few.get("evalsha", 0) / 2
    per_handoff_many = many.get("evalsha", 0) / 12
    assert per_handoff_many <= 1.5 * per_handoff_few + 1


async def test_hand_over_lands_after_the_waiters_pubsub_connection_was_killed(
    fresh: RedisHarness, admin: aioredis.Redis
) -> None:
    holder, waiter = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    lock = holder.lock("cut", fair=True)
    await lock.acquire()
    waiting = Holder(waiter.lock("cut", fair=True))
    await waiters(lock, 1)
    listener = redis_listener(waiter)
    before = listener.reconnects
    await admin.client_kill_filter(_type="pubsub")
    await lock.release()  # published while the waiter's client may not listen
    lease = await waiting.got()
    assert not lease.lost
    assert listener.reconnects > before
    await waiting.release()


async def test_a_lost_hand_over_message_is_found_by_the_waiters_poll(fresh: RedisHarness) -> None:
    holder, waiter = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    lock = holder.lock("lost", fair=True)
    await lock.acquire()
    waiting = Holder(waiter.lock("lost", fair=True))
    await waiters(lock, 1)
    with handovers_dropped(waiter) as dropped:
        await lock.release()
        lease = await waiting.got()
        assert len(dropped) == 1, "the hand-over was published once"
        assert not lease.lost
        info = await waiter.lock("lost", fair=True).info()
        assert info.owner is not None and info.owner.startswith(waiter.client_id)
    await waiting.release()


async def test_a_dead_waiter_is_skipped_at_once(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    """A waiter whose process died (SIGKILL: no clean-up) is not handed the
    lock: its client's channel has no listener any more, so the release takes
    the grant back and serves the next in line at once, long before the dead
    entry would expire (its ttl is long here)."""
    holder, patient = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    lock = holder.lock("dead", fair=True)
    await lock.acquire()
    async with children() as started:
        child = await Child.start(fresh.url, fresh.prefix, "fair", "dead", scaled(60), "0", "hold")
        started.append(child)
        await waiters(lock, 1)
        child.kill()  # no clean-up: its queue entry stays until it expires
        await child.wait()
        waiting = Holder(patient.lock("dead", fair=True))
        await waiters(lock, 2)
        entries = await queue_entries(admin, lock)
        dead_deadline = min(entries.values())
        await lock.release()
        lease = await waiting.got()
        seconds, micros = await admin.time()
        assert seconds * 1000 + micros // 1000 < dead_deadline, "the hand-over waited for the dead entry to expire"
        assert not lease.lost
        await waiting.release()


async def test_queue_entries_expire_by_the_servers_clock(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    holder, other = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    lock = holder.lock("ghost", fair=True)
    await lock.acquire()
    # A waiter that queues once and never polls again.
    entered = await redis_exclusive(holder).enter(LockRef("fair", "ghost"), "ghost-hold", TTL, enqueue=True, fresh=True)
    assert entered.token is None
    seconds, micros = await admin.time()
    deadline_ms = (await queue_entries(admin, lock))["ghost-hold"]
    server_now_ms = seconds * 1000 + micros // 1000
    # The deadline is the server's TIME plus the ttl (not this process's clock).
    assert 0 < deadline_ms - server_now_ms <= ms(TTL)
    assert (await lock.info()).waiters == 1
    while (await admin.time())[0] * 1000 <= deadline_ms + 1:
        await asyncio.sleep(0.02)
    assert (await lock.info()).waiters == 0
    await lock.release()
    # Not handed to the dead entry: free for anyone, even with timeout=0.
    free = other.lock("ghost", fair=True)
    await free.acquire(timeout=0)
    await free.release()


# -- semaphore ------------------------------------------------------------------------


async def test_a_sigkilled_holders_permit_comes_back_within_its_ttl(fresh: RedisHarness) -> None:
    mine, other = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    sem = mine.semaphore("pool", permits=2)
    await sem.acquire()
    async with children() as started:
        child = await Child.start(fresh.url, fresh.prefix, "sem", "pool", TTL, "0", "hold")
        started.append(child)
        held, token = (await child.line()).split()
        assert held == "held"
        both = await sem.info()
        assert len(both.holders) == 2
        child_hold = next(hold for hold in both.holders if not hold.startswith(mine.client_id))
        with pytest.raises(LockTimeout):
            await other.semaphore("pool", permits=2).acquire(timeout=0)
        child.kill()
        await child.wait()
        # Nobody renews the dead holder's permit: it comes back within its ttl (plus slack for a slow machine).
        lease = await other.semaphore("pool", permits=2).acquire(timeout=TTL + scaled(5))
        info = await sem.info()
        assert len(info.holders) == 2 and child_hold not in info.holders
        assert lease.token is not None and lease.token > int(token)
        await other.semaphore("pool", permits=2).release()
    await sem.release()


async def test_semaphore_release_hands_the_permit_to_one_waiter(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    clients = [fresh.connect(ttl=LONG) for _ in range(4)]
    sems = [c.semaphore("s", permits=2) for c in clients]
    await sems[0].acquire()
    await sems[1].acquire()
    holders = [Holder(sems[2])]
    await waiters(sems[0], 1)
    holders.append(Holder(sems[3]))
    await waiters(sems[0], 2)
    await admin.config_resetstat()
    await sems[0].release()
    await holders[0].got()  # the head of the queue
    assert (await commandstats(admin)).get("publish", 0) == 1, "one permit freed, one message"
    assert holders[1].lease is None and (await sems[0].info()).waiters == 1
    await sems[1].release()
    await holders[1].got()
    for holder in holders:
        await holder.release()


async def test_a_client_with_another_number_of_permits_is_refused(fresh: RedisHarness) -> None:
    """Two numbers for one semaphore would let too many in (3 holders where
    2 agreed on "at most 2"): the client that asks with another number than
    the holders and waiters use gets ValueError naming both, and neither
    holds nor waits afterwards; once nobody uses it, any number may start over."""
    two, five = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    sem = two.semaphore("agreed", permits=2)
    await sem.acquire()
    for timeout in (None, 0, scaled(5)):
        with pytest.raises(ValueError, match=r"permits=2.*permits=5") as caught:
            async with asyncio.timeout(scaled(5)):
                await five.semaphore("agreed", permits=5).acquire(timeout=timeout)
        assert "'agreed'" in str(caught.value)
        info = await sem.info()
        assert len(info.holders) == 1 and info.waiters == 0
    # the clients that agree go on as before: holders, a waiter, a hand-over
    third = Holder(fresh.connect(ttl=TTL).semaphore("agreed", permits=2))
    await third.got()
    waiting = Holder(fresh.connect(ttl=TTL).semaphore("agreed", permits=2))
    await waiters(sem, 1)
    await sem.release()
    await third.release()
    await waiting.got()
    await waiting.release()
    # nobody holds or waits: another number is fine now
    async with five.semaphore("agreed", permits=5) as lease:
        assert lease.token is not None
    with pytest.raises(ValueError, match="permits=5"):
        async with five.semaphore("agreed", permits=5), two.semaphore("agreed", permits=2):
            pass


# -- read-write lock ---------------------------------------------------------------


async def test_a_writer_is_not_starved_by_a_stream_of_readers(fresh: RedisHarness) -> None:
    readers = [fresh.connect(ttl=TTL) for _ in range(3)]
    writer = fresh.connect(ttl=TTL)
    probe = readers[0].rw_lock("stream").read
    queued_at: list[float] = []
    late_reads: list[float] = []
    written = asyncio.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def read_forever(client: asynclock.Locks) -> None:
        rw = client.rw_lock("stream")
        while not stop.is_set():
            started = loop.time()
            async with rw.read:
                if queued_at and started > queued_at[0] and not written.is_set():
                    late_reads.append(started)
                await asyncio.sleep(0.01)

    streams = [asyncio.create_task(read_forever(c)) for c in readers for _ in range(3)]
    await asyncio.sleep(0.1)  # readers overlap: the lock is never free of readers
    writing = Holder(writer.rw_lock("stream").write)
    await waiters(probe, 1, at_least=True)  # readers queue up behind it at once
    queued_at.append(loop.time())
    await writing.got()
    written.set()
    assert not late_reads, "a reader that came after the queued writer got in before it"
    await writing.release()
    stop.set()
    async with asyncio.timeout(scaled(10)):
        await asyncio.gather(*streams)


async def test_rw_tokens_share_one_counter(shared: RedisHarness) -> None:
    locks = shared.connect(ttl=TTL)
    rw = locks.rw_lock("tokens")
    tokens = []
    for _ in range(3):
        async with rw.read as lease:
            tokens.append(lease.token)
        async with rw.write as lease:
            tokens.append(lease.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


# -- all of them ----------------------------------------------------------------------


async def test_cancellation_at_random_points_leaves_no_entries_or_holds(fresh: RedisHarness) -> None:
    clients = [fresh.connect(ttl=TTL) for _ in range(3)]
    rnd = random.Random(8)

    def handles(client: asynclock.Locks) -> list[asynclock.Lock]:
        rw = client.rw_lock("c")
        return [client.lock("c", fair=True), rw.read, rw.write, client.semaphore("c", permits=2)]

    async def use(handle: asynclock.Lock) -> None:
        async with handle:
            await asyncio.sleep(rnd.uniform(0, 0.01))

    for _ in range(8):
        tasks = [asyncio.create_task(use(rnd.choice(handles(c)))) for c in clients for _ in range(4)]
        await asyncio.sleep(rnd.uniform(0, 0.02))
        for task in tasks:
            if rnd.random() < 0.6:
                task.cancel()
                await asyncio.sleep(rnd.uniform(0, 0.003))
        async with asyncio.timeout(scaled(20)):
            await asyncio.gather(*tasks, return_exceptions=True)
    # The harness checks that no key is left (holds, queues, waiting entries).
    for client in clients:
        await client.aclose()
    assert await fresh.leftovers() == []


@pytest.mark.parametrize("kind", ["fair", "rw"])
async def test_the_next_live_waiter_gets_a_dead_holders_lock_when_its_lease_ends(
    kind: str, fresh: RedisHarness
) -> None:
    """The holder and the first waiter die together (SIGKILL); the live waiter
    queued behind them polls only every third of its (long) ttl, yet gets the
    lock within a round trip of the holder's expiry: every waiter is told when
    the holder's lease ends, and its poll then passes over the dead head."""
    live = fresh.connect(ttl=LONG)
    handle = live.lock("gone", fair=True) if kind == "fair" else live.rw_lock("gone").write
    holder_ttl = scaled(1.5)
    async with children() as started:
        holder = await Child.start(fresh.url, fresh.prefix, kind, "gone", holder_ttl, "0", "hold")
        started.append(holder)
        assert (await holder.line()).startswith("held")
        head = await Child.start(fresh.url, fresh.prefix, kind, "gone", LONG, "1", "hold")
        started.append(head)
        await waiters(handle, 1)
        waiting = Holder(handle, timeout=holder_ttl + LONG / 6)
        await waiters(handle, 2)
        holder.kill()
        head.kill()
        await holder.wait()
        await head.wait()
        left = (await handle.info()).ttl
        assert left is not None and left > 0
        expiry = asyncio.get_running_loop().time() + left
        lease = await waiting.got()
        # Without the fix the live waiter learns at its next poll, up to LONG / 3 later.
        assert asyncio.get_running_loop().time() - expiry < scaled(1.0)
        assert not lease.lost
        await waiting.release()
        await asyncio.wait_for(waiting.task, scaled(10))


async def test_renewal_of_many_holds_is_one_script_call(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    locks = fresh.connect(ttl=TTL)
    sem = locks.semaphore("many", permits=50)
    queued = redis_shared(locks)
    ref = LockRef("semaphore", "many", 50)

    holds = []
    for i in range(20):
        hold = f"h{i}"
        entered = await queued.enter(ref, hold, TTL, enqueue=False, fresh=True)
        assert entered.token is not None and entered.token > 0
        holds.append(RenewItem(ref, hold, TTL))
    await queued.renew(holds)  # the script is loaded now
    await admin.config_resetstat()
    results = await queued.renew([*holds, RenewItem(ref, "nobody", TTL)])
    assert results == [True] * 20 + [False]
    assert (await commandstats(admin)).get("evalsha", 0) == 1
    info = await sem.info()
    assert len(info.holders) == 20 and info.waiters == 0
    for item in holds:
        assert await queued.release(ref, item.hold)


async def test_cluster_refuses_the_primitives_without_io() -> None:
    from asynclock.backends.cluster import ClusterBackend

    locks = asynclock.connect("redis+cluster://127.0.0.1:1")
    assert isinstance(locks.backend, ClusterBackend)
    with pytest.raises(NotImplementedError, match="redis://"):
        locks.lock("x", fair=True)
    with pytest.raises(NotImplementedError):
        locks.semaphore("x", permits=2)
    with pytest.raises(NotImplementedError):
        locks.rw_lock("x")
    await locks.aclose()


# -- through Sentinel -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSetup]:
    group = SentinelSetup()
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


async def test_fair_lock_and_semaphore_through_sentinel(sentinels: SentinelSetup) -> None:
    prefix = f"s{random.getrandbits(32):x}"
    async with (
        asynclock.connect(sentinels.url, prefix=prefix, ttl=TTL) as a,
        asynclock.connect(sentinels.url, prefix=prefix, ttl=TTL) as b,
    ):
        assert isinstance(a.backend, RedisBackend)
        lock = a.lock("s", fair=True)
        await lock.acquire()
        waiting = Holder(b.lock("s", fair=True))
        await waiters(lock, 1)
        await lock.release()
        lease = await waiting.got()
        assert not lease.lost
        await waiting.release()
        async with a.semaphore("p", permits=2), b.semaphore("p", permits=2):
            assert len((await a.semaphore("p", permits=2).info()).holders) == 2


async def test_closing_the_client_ends_its_queued_acquires(fresh: RedisHarness) -> None:
    holder, waiter = fresh.connect(ttl=LONG), fresh.connect(ttl=LONG)
    lock = holder.lock("closing", fair=True)
    await lock.acquire()
    task = asyncio.create_task(waiter.lock("closing", fair=True).acquire())
    await waiters(lock, 1)
    await waiter.aclose()
    with pytest.raises(asynclock.BackendUnavailable):
        async with asyncio.timeout(scaled(10)):
            await task
    assert (await lock.info()).waiters == 0, "the closed client's entry left the queue"
    await lock.release()


async def test_primitives_refused_with_replicas(redis_server: RedisServer) -> None:
    locks = asynclock.connect(redis_server.url + "?replicas=1")
    with pytest.raises(NotImplementedError, match="replicas"):
        locks.semaphore("x", permits=2)
    await locks.aclose()


async def test_scripts_are_reloaded_after_script_flush(fresh: RedisHarness, admin: aioredis.Redis) -> None:
    locks = fresh.connect(ttl=TTL)
    rw = locks.rw_lock("flushed")
    async with rw.write as first:
        await admin.script_flush()
        async with rw.read:  # joins the write hold: set_count, a script call after the flush
            pass
    await admin.script_flush()
    async with locks.semaphore("flushed", permits=2) as permit, rw.read as read:
        assert read.token is not None and first.token is not None and read.token > first.token
        assert permit.token is not None
    assert await fresh.leftovers() == []


async def _server_ms_left(admin: aioredis.Redis, key: str, hold: str) -> int:
    """Milliseconds the server keeps ``hold`` (the lock key's expiry minus the server's TIME)."""
    async with admin.pipeline(transaction=True) as pipe:
        pipe.get(key)
        pipe.pexpiretime(key)
        pipe.time()
        value, expires, (seconds, micros) = await pipe.execute()
    assert value is not None and value.decode().endswith(f" {hold}") and expires > 0
    return int(expires) - (seconds * 1000 + micros // 1000)


@pytest.mark.parametrize("drop_message", [False, True])
async def test_a_handed_over_lease_is_never_trusted_past_the_servers_expiry(
    fresh: RedisHarness, admin: aioredis.Redis, drop_message: bool
) -> None:
    holder, waiter = fresh.connect(ttl=TTL), fresh.connect(ttl=TTL)
    lock = holder.lock("trust", fair=True)
    await lock.acquire()
    waiting = Holder(waiter.lock("trust", fair=True))
    await waiters(lock, 1)
    # with the message dropped, the poll finds the hand-over instead
    with handovers_dropped(waiter) if drop_message else contextlib.nullcontext([]):
        await asyncio.sleep(TTL / 2)  # the waiter has polled at least once meanwhile
        await lock.release()
        lease = await waiting.got()
    info = await waiter.lock("trust", fair=True).info()
    server_left = await _server_ms_left(admin, lock.key, info.owner or "")
    # The client trusts the lease until confirmed_at + ttl - drift(ttl); read after the
    # server's answer, confirmed_at + ttl is not later than the server's expiry.
    local_left = (lease.expires_at + drift(TTL) - asyncio.get_running_loop().time()) * 1000
    assert local_left <= server_left + 1, (local_left, server_left)  # + 1: the server counts whole ms
    await waiting.release()


async def test_fair_lock_queue_and_hand_over_survive_a_sentinel_failover() -> None:
    setup = SentinelSetup()
    try:
        await asyncio.to_thread(setup.start)
        ttl = scaled(6)
        prefix = f"f{random.getrandbits(32):x}"
        async with (
            asynclock.connect(setup.url, prefix=prefix, ttl=ttl) as holder,
            asynclock.connect(setup.url, prefix=prefix, ttl=ttl) as other,
        ):
            lock = holder.lock("kept", fair=True)
            lease = await lock.acquire()
            order: list[str] = []

            async def wait_for_it() -> None:
                async with other.lock("kept", fair=True):
                    order.append("waiter got it")

            waiter = asyncio.create_task(wait_for_it())
            await waiters(lock, 1)
            replica = aioredis.Redis(host="127.0.0.1", port=setup.replica.port)
            try:  # the hold and the queue entry reached the replica
                async with asyncio.timeout(scaled(10)):
                    while await replica.llen(f"{lock.key}:q") != 1 or not await replica.exists(lock.key):
                        await asyncio.sleep(0.02)
            finally:
                await replica.aclose()
            old = setup.current_primary_port()
            assert old is not None
            setup.server_on(old).kill()
            assert await asyncio.to_thread(setup.wait_failover, old) == setup.replica.port
            # the hold is renewed on the new primary, the waiter is still queued there
            renewed = lease.expires_at
            async with asyncio.timeout(scaled(15)):
                while lease.expires_at == renewed:
                    await asyncio.sleep(0.05)
            assert not lease.lost and not waiter.done()
            await waiters(lock, 1)
            order.append("released")
            await lock.release()
            await asyncio.wait_for(waiter, scaled(10))
            assert order == ["released", "waiter got it"]
    finally:
        await asyncio.to_thread(setup.cleanup)
