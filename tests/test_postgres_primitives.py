"""The fair lock, read-write lock and semaphore on a real PostgreSQL: what the
server's lock manager promises to plain sessions (grants in queue order, a
release handing the lock over with no free instant, a new shared request
queued behind a waiting exclusive one), what asynclock's own queue table
promises (FIFO, no newcomer ahead of a waiter, a waiting writer ahead of new
readers, no session in a lock wait), and what only PostgreSQL can show
(permits across processes, a SIGKILLed or terminated holder's permit back,
nothing left on the server after cancellations).

The generic semantics run in ``test_primitives.py`` and the lock contract in
``test_shapes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

import asynclock
from asynclock import LockTimeout
from asynclock.backends.postgres import advisory_key, gate_key, rw_key
from tests.child import ChildProcess, children
from tests.harnesses import insides
from tests.harnesses.postgres import PostgresHarness, postgres_backend, tokens_from, unsigned
from tests.servers import scaled
from tests.servers.postgres import PostgresServer
from tests.test_primitives import Holder

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)
#: A lease far longer than any wait in these tests: only a release or a
#: session's end, never an expiry, can free what is held with it.
LONG = scaled(30.0)


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = scaled(10)) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def lock_rows(pg: PostgresHarness, key: tuple[int, int]) -> list[tuple[int, bool, str]]:
    """(pid, granted, mode) of every session holding or waiting for the two-int advisory ``key``."""
    high, low = unsigned(key)
    rows = await (await pg.admin()).fetch(
        """SELECT pid, granted, mode FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
           AND classid::int8 = $1 AND objid::int8 = $2 ORDER BY pid""",
        high,
        low,
    )
    return [(int(row["pid"]), bool(row["granted"]), str(row["mode"])) for row in rows]


async def waiting(pg: PostgresHarness, key: tuple[int, int]) -> int:
    return sum(1 for _, granted, _ in await lock_rows(pg, key) if not granted)


async def queued(pg: PostgresHarness, key: tuple[int, int], count: int) -> None:
    """Wait until ``count`` sessions wait in the server's own lock queue for ``key`` (plain sessions)."""

    async def check() -> bool:
        return await waiting(pg, key) == count

    await until(check, f"{count} session(s) queued on {key}")


async def in_queue(pg: PostgresHarness, key: tuple[int, int], count: int) -> None:
    """Wait until ``count`` waiters of asynclock are in the queue table for ``key`` (none in a server lock wait)."""

    async def check() -> bool:
        return await pg.queued_on(key) == count

    await until(check, f"{count} waiter(s) in the queue for {key}")
    assert await pg.lock_waits() == 0


# -- what the server promises ---------------------------------------------------------


async def test_the_server_hands_a_released_lock_to_the_head_waiter_with_no_free_instant(
    pg: PostgresHarness,
) -> None:
    # Plain sessions, no asynclock: the lock manager's own behaviour that the
    # fair lock and the read-write lock rely on.
    key = (11, 22)
    sessions = [await asyncpg.connect(pg.server.dsn) for _ in range(4)]
    holder, first, second, jumper = sessions
    try:
        await holder.execute("SELECT pg_advisory_lock($1::int4, $2::int4)", *key)
        waits = []
        for conn in (first, second):
            waits.append(asyncio.create_task(conn.execute("SELECT pg_advisory_lock($1::int4, $2::int4)", *key)))
            await queued(pg, key, len(waits))
        # While the lock is held and waited for, a try fails.
        assert not await jumper.fetchval("SELECT pg_try_advisory_lock($1::int4, $2::int4)", *key)
        await holder.execute("SELECT pg_advisory_unlock($1::int4, $2::int4)", *key)
        # The unlock has returned: the head waiter already holds it (granted
        # inside the release), so a try right now still fails...
        assert not await jumper.fetchval("SELECT pg_try_advisory_lock($1::int4, $2::int4)", *key)
        rows = await lock_rows(pg, key)
        granted = [pid for pid, got, _ in rows if got]
        assert granted == [first.get_server_pid()]
        await asyncio.wait_for(waits[0], scaled(5))
        assert not waits[1].done()
        # ...and the next release goes to the next in line.
        await first.execute("SELECT pg_advisory_unlock($1::int4, $2::int4)", *key)
        await asyncio.wait_for(waits[1], scaled(5))
        assert [pid for pid, got, _ in await lock_rows(pg, key) if got] == [second.get_server_pid()]
    finally:
        for conn in sessions:
            await conn.close()


async def test_the_server_queues_a_new_reader_behind_a_waiting_writer(pg: PostgresHarness) -> None:
    key = (33, 44)
    reader, writer, late = [await asyncpg.connect(pg.server.dsn) for _ in range(3)]
    try:
        assert await reader.fetchval("SELECT pg_try_advisory_lock_shared($1::int4, $2::int4)", *key)
        write = asyncio.create_task(writer.execute("SELECT pg_advisory_lock($1::int4, $2::int4)", *key))
        await queued(pg, key, 1)
        # Shared with the holder, but a writer waits: refused.
        assert not await late.fetchval("SELECT pg_try_advisory_lock_shared($1::int4, $2::int4)", *key)
        read = asyncio.create_task(late.execute("SELECT pg_advisory_lock_shared($1::int4, $2::int4)", *key))
        await queued(pg, key, 2)
        await reader.execute("SELECT pg_advisory_unlock_shared($1::int4, $2::int4)", *key)
        await asyncio.wait_for(write, scaled(5))
        assert not read.done()
        await writer.execute("SELECT pg_advisory_unlock($1::int4, $2::int4)", *key)
        await asyncio.wait_for(read, scaled(5))
    finally:
        for conn in (reader, writer, late):
            await conn.close()


# -- fair lock ------------------------------------------------------------------------


async def test_the_fair_lock_is_the_plain_lock(pg: PostgresHarness) -> None:
    locks, other = pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    assert locks.lock("same", fair=True).key == locks.lock("same").key
    async with locks.lock("same") as plain:
        with pytest.raises(LockTimeout):
            await other.lock("same", fair=True).acquire(timeout=SHORT)
        info = await other.lock("same", fair=True).info()
        assert info.owner is not None and info.owner.startswith(locks.client_id)
    async with other.lock("same", fair=True) as fair:
        assert plain.token is not None and fair.token is not None and fair.token > plain.token  # one counter


async def test_a_try_at_the_handover_never_beats_the_queued_waiter(pg: PostgresHarness) -> None:
    holder, waiter, jumper = (pg.connect(ttl=LONG) for _ in range(3))
    key = advisory_key(pg.prefix, "handover")
    for round_ in range(5):
        order: list[str] = []
        lock = holder.lock("handover", fair=True)
        await lock.acquire()
        waited = asyncio.create_task(_take(waiter.lock("handover", fair=True), "waiter", order))
        await in_queue(pg, key, 1)
        stop = asyncio.Event()
        jumping = asyncio.create_task(_jump(jumper.lock("handover", fair=True), order, stop))
        await asyncio.sleep(random.uniform(0, 0.01))
        await lock.release()
        await asyncio.wait_for(waited, scaled(10))
        stop.set()
        await asyncio.wait_for(jumping, scaled(10))
        assert order[0] == "waiter", (round_, order)


async def _jump(lock: asynclock.Lock, order: list[str], stop: asyncio.Event) -> None:
    """Try (timeout=0) as fast as it can, through the release and the grant, until stopped."""
    while not stop.is_set():
        with contextlib.suppress(LockTimeout):
            await _take(lock, "jumper", order, timeout=0)
        await asyncio.sleep(0)


async def _take(lock: asynclock.Lock, tag: str, order: list[str], timeout: float | None = None) -> None:
    async with asyncio.timeout(scaled(10)):
        await lock.acquire(timeout=timeout)
    order.append(tag)
    await lock.release()


async def test_fair_waiters_of_many_clients_get_it_in_queue_order(pg: PostgresHarness) -> None:
    clients = [pg.connect(ttl=LONG) for _ in range(6)]
    key = advisory_key(pg.prefix, "line")
    holder = clients[0].lock("line", fair=True)
    await holder.acquire()
    order: list[int] = []
    tasks = []
    for i in range(1, 6):
        tasks.append(asyncio.create_task(_take(clients[i].lock("line", fair=True), str(i), order)))
        await in_queue(pg, key, i)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(10))
    assert order == ["1", "2", "3", "4", "5"]


# -- read-write lock --------------------------------------------------------------------


@pytest.mark.parametrize("source", ["sequence", "table"])
async def test_the_read_holds_of_one_client_share_one_shared_lock(pg: PostgresHarness, source: str) -> None:
    # Two tasks of one client read: one shared lock on the server for both (a
    # session must never take what it holds again), each with its own token;
    # the lock goes when the last of them releases. The same when both were
    # queued behind a writer: the second joins the first's lock from the queue.
    readers, writer = tokens_from(pg.connect(ttl=TTL), source), tokens_from(pg.connect(ttl=TTL), source)
    key = rw_key(pg.prefix, "shared")

    async def shared_rows() -> list[tuple[int, bool, str]]:
        return [row for row in await lock_rows(pg, key) if row[1]]

    first = await readers.rw_lock("shared").read.acquire(timeout=0, detached=True)
    second = await readers.rw_lock("shared").read.acquire(timeout=0, detached=True)
    assert first.token is not None and second.token is not None and second.token > first.token
    assert [mode for _, _, mode in await shared_rows()] == ["ShareLock"]
    assert len((await writer.rw_lock("shared").read.info()).holders) == 2
    await first.release()
    assert len(await shared_rows()) == 1  # the second read hold keeps it
    await second.release()
    assert await shared_rows() == []
    # behind a writer: both queue, then share one lock again
    write = await writer.rw_lock("shared").write.acquire(detached=True)
    waiting = [
        asyncio.create_task(readers.rw_lock("shared").read.acquire(timeout=scaled(10), detached=True)) for _ in range(2)
    ]
    await in_queue(pg, key, 2)
    await write.release()
    leases = await asyncio.wait_for(asyncio.gather(*waiting), scaled(10))
    assert [mode for _, _, mode in await shared_rows()] == ["ShareLock"]
    tokens = [lease.token for lease in leases]
    assert None not in tokens and len(set(tokens)) == 2 and min(tokens) > (write.token or 0)  # type: ignore[type-var]
    for lease in leases:
        await lease.release()
    assert await shared_rows() == []


async def test_a_writer_gets_in_through_a_stream_of_readers(pg: PostgresHarness) -> None:
    readers = [pg.connect(ttl=TTL) for _ in range(4)]
    writer, late = pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    key = rw_key(pg.prefix, "stream")
    events: list[str] = []
    stop = asyncio.Event()

    async def read(i: int) -> None:
        # Overlapping readers that keep coming back.
        await asyncio.sleep(0.005 * i)
        while not stop.is_set():
            async with readers[i].rw_lock("stream").read:
                events.append("reader")
                await asyncio.sleep(0.015)

    # One reader holds all along until the writer has queued, so it must queue.
    first = Holder(readers[0].rw_lock("stream").read)
    await first.got()
    streams = [asyncio.create_task(read(i)) for i in range(1, 4)]
    await until(lambda: _truthy(len(events) >= 3), "readers running")
    write = asyncio.create_task(_take(writer.rw_lock("stream").write, "writer", events))

    async def writer_queued() -> bool:
        return False in await pg.queue_rows(key)

    await until(writer_queued, "the writer queued")
    # A reader that asks now, while the lock is held by readers only, waits
    # behind the writer.
    reading = asyncio.create_task(_take(late.rw_lock("stream").read, "late reader", events))
    await asyncio.sleep(0.05)
    assert "late reader" not in events
    await first.release()
    await asyncio.wait_for(asyncio.gather(write, reading), scaled(10))
    stop.set()
    await asyncio.wait_for(asyncio.gather(*streams), scaled(10))
    assert events.index("writer") < events.index("late reader")


async def _truthy(value: bool) -> bool:
    return value


async def test_read_and_write_share_a_counter_on_a_key_of_their_own(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    rw = locks.rw_lock("doc")
    assert rw.read.key == rw.write.key != locks.lock("doc").key
    async with locks.lock("doc"):  # the plain lock of the same name is another lock
        first = await rw.read.acquire(timeout=0)
        await rw.read.release()
        second = await rw.write.acquire(timeout=0)
        await rw.write.release()
    assert first.token is not None and second.token is not None and second.token > first.token
    assert await postgres_backend(locks).names() == []


# -- semaphore --------------------------------------------------------------------------

#: A process of its own using a semaphore: "hold" takes a permit and keeps it
#: until killed; "use" runs three tasks that take and give back permits,
#: printing each hold's token and the monotonic times it began and ended.
CHILD = r"""
import asyncio, sys, time
import asynclock

async def main(url, prefix, mode, name, ttl, permits, rounds):
    async with asynclock.connect(url, prefix=prefix, ttl=float(ttl)) as locks:
        sem = locks.semaphore(name, permits=int(permits))
        print("started", flush=True)
        if mode == "hold":
            lease = await sem.acquire()
            print("held", lease.token, flush=True)
            await asyncio.sleep(3600)
            return

        async def use():
            for _ in range(int(rounds)):
                async with sem as lease:
                    began = time.monotonic()
                    await asyncio.sleep(0.004)
                    print("hold", lease.token, began, time.monotonic(), flush=True)

        await asyncio.gather(*(use() for _ in range(3)))
        print("done", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


class Child(ChildProcess):
    """A child Python process using a semaphore."""

    @classmethod
    async def start(cls, pg: PostgresHarness, mode: str, name: str, ttl: float, permits: int, rounds: int) -> Child:
        return await cls.spawn(CHILD, pg.url, pg.prefix, mode, name, str(ttl), str(permits), str(rounds))


async def test_permits_are_never_exceeded_across_processes(pg: PostgresHarness) -> None:
    holds: list[tuple[int, float, float]] = []
    async with children() as started:
        for _ in range(3):
            started.append(await Child.start(pg, "use", "pool", TTL, 2, 6))
        for child in started:
            while (line := await child.line()) != "done":
                _, token, began, ended = line.split()
                holds.append((int(token), float(began), float(ended)))
            assert await child.wait() == 0
    assert len(holds) == 3 * 3 * 6
    # Every hold's [began, ended] lies inside its permit (taken before, given
    # back after), and the clock is the machine's: at no instant more than two.
    moments = sorted([(began, 1) for _, began, _ in holds] + [(ended, -1) for _, _, ended in holds])
    inside = peak = 0
    for _, step in moments:
        inside += step
        peak = max(peak, inside)
    assert peak <= 2, f"{peak} holders of a 2-permit semaphore at once"
    assert peak == 2  # they did overlap
    tokens = [token for token, _, _ in holds]
    assert len(set(tokens)) == len(tokens), "every permit has its own token"


async def test_a_sigkilled_holders_permit_comes_back_at_once(pg: PostgresHarness) -> None:
    # The holder's lease is 30 s: only its session's end can free the permit
    # within the waiter's bound.
    waiter = pg.connect(ttl=LONG)
    sem = waiter.semaphore("crash", permits=1)
    async with children() as started:
        child = await Child.start(pg, "hold", "crash", LONG, 1, 0)
        started.append(child)
        held, token = (await child.line()).split()
        assert held == "held"
        waiting = Holder(sem, timeout=scaled(10))
        await queued_or_head(pg, "crash")
        child.kill()
        await child.wait()
        lease = await waiting.got()
    assert lease.token is not None and lease.token > int(token)
    await waiting.release()


async def queued_or_head(pg: PostgresHarness, name: str, count: int = 1) -> None:
    """Wait until ``count`` waiters of the semaphore ``name`` are queued at its gate."""
    await in_queue(pg, gate_key(pg.prefix, name), count)


async def test_a_terminated_holder_loses_its_permit_and_the_head_waiter_gets_it(pg: PostgresHarness) -> None:
    holder, waiter = pg.connect(ttl=LONG), pg.connect(ttl=LONG)
    lease = await holder.semaphore("cut", permits=1).acquire()
    waiting = Holder(waiter.semaphore("cut", permits=1), timeout=scaled(10))
    await queued_or_head(pg, "cut")
    assert await pg.expire_shape("semaphore", "cut")
    reason = await asyncio.wait_for(lease.wait_lost(), scaled(5))
    assert reason
    got = await waiting.got()
    assert lease.token is not None and got.token is not None and got.token > lease.token
    await waiting.release()


async def test_waiters_queue_at_the_gate_and_only_the_head_tries(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=LONG)
    clients = [pg.connect(ttl=LONG) for _ in range(4)]
    sem = holder.semaphore("gate", permits=1)
    await sem.acquire()
    order: list[str] = []
    tasks = []
    for i, client in enumerate(clients):
        tasks.append(asyncio.create_task(_take(client.semaphore("gate", permits=1), str(i), order)))
        await queued_or_head(pg, "gate", i + 1)
    # Four rows in the queue table, no session waiting on the server, and nobody
    # holds the gate key (only the queue is kept under it).
    assert await pg.queued_on(gate_key(pg.prefix, "gate")) == 4
    assert await lock_rows(pg, gate_key(pg.prefix, "gate")) == []
    info = await sem.info()
    assert info.waiters == 4 and len(info.holders) == 1
    await sem.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(10))
    assert order == ["0", "1", "2", "3"]  # the gate's queue is FIFO


async def test_a_newcomer_does_not_take_a_permit_ahead_of_the_waiters(pg: PostgresHarness) -> None:
    holder, newcomer = pg.connect(ttl=LONG), pg.connect(ttl=LONG)
    first, second = (Holder(holder.semaphore("ahead", permits=2)) for _ in range(2))
    await first.got()
    await second.got()
    async with children() as started:
        # The waiter is another process, frozen once it is the head: the
        # permit freed below stays free until it thaws.
        waiter = await Child.start(pg, "hold", "ahead", LONG, 2, 0)
        started.append(waiter)
        await queued_or_head(pg, "ahead")
        waiter.proc.send_signal(signal.SIGSTOP)
        try:
            await first.release()
            for _ in range(3):
                with pytest.raises(LockTimeout):
                    await newcomer.semaphore("ahead", permits=2).acquire(timeout=0)
        finally:
            waiter.proc.send_signal(signal.SIGCONT)
        assert (await waiter.line()).startswith("held")
        await second.release()
        async with newcomer.semaphore("ahead", permits=2):  # no waiter left: a try gets the free permit
            pass


async def test_info_lists_every_holder_of_a_semaphore_and_a_read_lock(pg: PostgresHarness) -> None:
    a, b = pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    first = await a.semaphore("many", permits=3).acquire()
    second = await a.semaphore("many", permits=3).acquire(detached=True)  # another owner of the same client
    third = await b.semaphore("many", permits=3).acquire()
    info = await b.semaphore("many", permits=3).info()
    assert len(info.holders) == 3
    assert sum(hold.startswith(a.client_id) for hold in info.holders) == 2
    assert len({first.token, second.token, third.token}) == 3
    await a.rw_lock("doc").read.acquire()
    await b.rw_lock("doc").read.acquire()
    rinfo = await a.rw_lock("doc").write.info()
    assert len(rinfo.holders) == 2 and rinfo.waiters == 0
    await a.rw_lock("doc").read.release()
    await b.rw_lock("doc").read.release()
    await b.semaphore("many", permits=3).release()
    await a.semaphore("many", permits=3).release()
    await a.aclose()  # the permit of the other task goes with the client


# -- cancellation ---------------------------------------------------------------------


async def test_cancelled_waiters_of_every_primitive_leave_no_advisory_lock(pg: PostgresHarness) -> None:
    holders, waiters = pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    rng = random.Random(8)
    handles = [
        lambda: waiters.lock("c", fair=True),
        lambda: waiters.rw_lock("c").read,
        lambda: waiters.rw_lock("c").write,
        lambda: waiters.semaphore("c", permits=2),
    ]
    held = [holders.lock("c", fair=True), holders.rw_lock("c").write, holders.semaphore("c", permits=2)]

    async def use(handle: asynclock.Lock) -> None:
        async with handle:
            await asyncio.sleep(rng.uniform(0, 0.005))

    async def churn() -> None:
        # The holders take and give back at random moments meanwhile.
        while True:
            for lock in held:
                await lock.acquire()
            await asyncio.sleep(rng.uniform(0, 0.01))
            for lock in held:
                await lock.release()
            await asyncio.sleep(rng.uniform(0, 0.01))

    async def nothing_left() -> bool:
        return await pg.granted_to(waiters) == []

    churner = asyncio.create_task(churn())
    try:
        for _ in range(25):
            tasks = [asyncio.create_task(use(make())) for make in handles for _ in range(2)]
            await asyncio.sleep(rng.uniform(0, 0.02))
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), results
            await until(nothing_left, "the waiters' sessions hold nothing", scaled(5))
    finally:
        churner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await churner
    for lock in held:
        if lock.held:
            await lock.release()
    # Nobody queued on any of the keys, and every session back in the pool.
    for key in (advisory_key(pg.prefix, "c"), rw_key(pg.prefix, "c"), gate_key(pg.prefix, "c")):
        await in_queue(pg, key, 0)
    pool = postgres_backend(waiters).pool
    assert pool is not None

    async def all_back() -> bool:
        return bool(pool.get_size() - pool.get_idle_size() == 1)  # the listening session only

    await until(all_back, "every session back in the pool")


async def test_waits_on_a_given_pools_connections_leave_them_clean(pg: PostgresHarness) -> None:
    # A given pool keeps its own reset off here, so whatever asynclock left
    # on a connection would show.
    pool = await asyncpg.create_pool(pg.server.dsn, min_size=0, max_size=8, reset=_keep_state)
    try:
        locks = asynclock.connect(pool, ttl=TTL, prefix=pg.prefix)
        insides.adopt(pg, locks)
        other = pg.connect(ttl=TTL)
        for make in (
            lambda c: c.lock("g", fair=True),
            lambda c: c.rw_lock("g").write,
            lambda c: c.semaphore("g", permits=1),
        ):
            held = Holder(make(other))
            await held.got()
            waiting = Holder(make(locks), timeout=scaled(10))  # waits: the per-wait settings are made
            await asyncio.sleep(0.05)
            await held.release()
            lease = await waiting.got()
            assert not lease.lost
            await waiting.release()
        await locks.aclose()
        conns = [await pool.acquire() for _ in range(pool.get_size())]  # every connection it made
        try:
            for conn in conns:
                assert not (await conn.fetchval("SHOW application_name")).startswith("asynclock")
                assert await conn.fetchval("SHOW idle_session_timeout") == "0"
                assert await conn.fetchval("SHOW client_connection_check_interval") == "0"
                assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0
                held_here = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                assert await conn.fetchval(held_here) == 0
        finally:
            for conn in conns:
                await pool.release(conn)
    finally:
        await pool.close()


async def _keep_state(conn: asyncpg.Connection) -> None:
    """A pool reset that resets nothing."""


@pytest.mark.parametrize("kind", ["read", "write", "semaphore"])
async def test_a_locked_fence_row_ends_the_acquire_in_time_with_nothing_kept(pg: PostgresHarness, kind: str) -> None:
    # Tokens from the table (servers before 15): an application (or a client of
    # another prefix sharing the table) holds the fence row: the acquire waits
    # for it no longer than its timeout, and whatever it got meanwhile is given back.
    locks, other = tokens_from(pg.connect(ttl=TTL), "table"), tokens_from(pg.connect(ttl=TTL), "table")

    def handle(client: asynclock.Locks) -> asynclock.Lock:
        if kind == "semaphore":
            return client.semaphore("row", permits=2)
        rw = client.rw_lock("row")
        return rw.read if kind == "read" else rw.write

    async with handle(locks):
        pass  # the fence row exists now
    row = (b"\xffsem\0" if kind == "semaphore" else b"\xffrw\0") + b"row"
    admin = await pg.admin()
    tx = admin.transaction()
    await tx.start()
    try:
        assert await admin.fetchval(f'SELECT value FROM "{pg.prefix}_fence" WHERE name = $1 FOR UPDATE', row) == 1
        with pytest.raises(LockTimeout):
            await handle(locks).acquire(timeout=SHORT)
        with pytest.raises(LockTimeout):
            await handle(locks).acquire(timeout=0)
        assert await pg.granted_to(locks) == []
    finally:
        await tx.rollback()
    async with asyncio.timeout(scaled(5)), handle(other) as lease:
        assert lease.token == 2
