"""PostgreSQL-only behaviour: shared sessions, the queue table, the session as the lease,
hash collisions, cancellation at many points, a given pool, faults.

Every test runs against a real PostgreSQL (initdb'ed into a temp dir by the
session fixture); a fresh prefix per test isolates keys and the fence table.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.backends.postgres import FLOOR, PARK_TIME, PostgresBackend, advisory_key
from tests.harnesses import insides
from tests.harnesses.postgres import (
    PostgresHarness,
    pg_listener,
    pg_running,
    postgres_backend,
    share_key,
    tokens_from,
    unsigned,
)
from tests.servers import free_port, scaled
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


async def waiting_on(pg: PostgresHarness, name: str) -> int:
    """How many waiters for ``name`` the queue table holds (live rows)."""
    return await pg.queued_on(advisory_key(pg.prefix, name))


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = scaled(5)) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def queued(pg: PostgresHarness, name: str, count: int) -> None:
    """Wait until exactly ``count`` waiters are queued for ``name``."""

    async def check() -> bool:
        return await waiting_on(pg, name) == count

    await until(check, f"{count} waiter(s) queued for {name!r}")


# -- connecting --------------------------------------------------------------


async def test_both_url_schemes_reach_the_same_locks(pg: PostgresHarness) -> None:
    a = pg.connect(ttl=TTL)
    b = asynclock.connect(pg.url.replace("postgresql://", "postgres://", 1), ttl=TTL, prefix=pg.prefix)
    insides.adopt(pg, b)
    async with a.lock("scheme"):
        with pytest.raises(LockTimeout):
            await b.lock("scheme").acquire(timeout=0)
    assert isinstance(b.backend, PostgresBackend)


async def test_a_given_pool_is_used_and_not_closed(pg: PostgresHarness) -> None:
    pool = await asyncpg.create_pool(pg.server.dsn, min_size=0, max_size=6)
    try:
        locks = asynclock.connect(pool, ttl=TTL, prefix=pg.prefix)
        insides.adopt(pg, locks)
        backend = postgres_backend(locks)
        assert backend.pool is pool
        # half of the pool at most goes to locks, so the application keeps the rest
        assert backend.max_leases == 3
        async with locks.lock("given") as lease:
            assert isinstance(lease.token, int)
            assert pool.get_size() >= 1
        await locks.aclose()
        assert await pool.fetchval("SELECT 41 + 1") == 42
        # the lease connection went back clean: no lock, no asynclock settings
        async with pool.acquire() as conn:
            assert not (await conn.fetchval("SHOW application_name")).startswith("asynclock")
            assert await conn.fetchval("SHOW idle_session_timeout") == "0"
    finally:
        await pool.close()


async def test_max_leases_bounds_sessions_not_holds(pg: PostgresHarness) -> None:
    # Holds share sessions: with one session, a client holds many locks at once,
    # taken together, and uses two connections (its session and its listening one).
    locks = pg.connect(ttl=TTL, max_leases=1)
    backend = postgres_backend(locks)
    names = [f"m{i}" for i in range(12)]
    leases = await asyncio.gather(*(locks.lock(name).acquire(timeout=scaled(5), detached=True) for name in names))
    assert sorted(await backend.names()) == sorted(names)
    pids = {await pg.holder_pid(name) for name in names}
    assert len(pids) == 1 and None not in pids
    assert backend.pool is not None and backend.pool.get_size() <= 2
    # another client still gets none of them
    other = pg.connect(ttl=TTL)
    with pytest.raises(LockTimeout):
        await other.lock("m3").acquire(timeout=0)
    for lease in leases:
        await lease.release()
    async with other.lock("m3"):
        pass


async def _holds(locks: asynclock.Locks, name: str) -> bool:
    return name in await postgres_backend(locks).names()


async def _hold_until(locks: asynclock.Locks, name: str, done: asyncio.Event) -> None:
    async with locks.lock(name):
        await done.wait()


async def test_a_given_pools_command_timeout_does_not_cut_lock_waits(pg: PostgresHarness) -> None:
    pool = await asyncpg.create_pool(pg.server.dsn, min_size=0, max_size=4, command_timeout=scaled(0.2))
    try:
        waiter = asynclock.connect(pool, ttl=TTL, prefix=pg.prefix)
        insides.adopt(pg, waiter)
        holder = pg.connect(ttl=TTL)
        lock = holder.lock("patient")
        held = await lock.acquire()
        task = asyncio.create_task(waiter.lock("patient").acquire(timeout=scaled(5)))
        await queued(pg, "patient", 1)
        await asyncio.sleep(scaled(0.5))  # well past the pool's command_timeout
        assert not task.done()
        await lock.release()
        lease = await asyncio.wait_for(task, scaled(5))
        assert lease.token is not None and held.token is not None and lease.token > held.token
    finally:
        await waiter.aclose()
        await pool.close()


async def test_unreachable_server_raises_backend_unavailable_not_asyncpg(pg: PostgresHarness) -> None:
    locks = asynclock.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", ttl=TTL)
    try:
        with pytest.raises(BackendUnavailable) as caught:
            await locks.lock("nowhere").acquire(timeout=scaled(1))
        assert not type(caught.value).__module__.startswith("asyncpg")
        assert caught.value.__cause__ is not None
    finally:
        await locks.aclose()


async def test_sessions_are_reused_then_go_back_to_the_pool_clean(pg: PostgresHarness) -> None:
    # One task taking locks one after the other uses one session: the same
    # session holds the next lock at once (no pool hand-over). A session left
    # without holds goes back to the pool after PARK_TIME, with no lock and no
    # setting of ours; only the listening session stays with the client.
    locks = pg.connect(ttl=TTL)
    backend = postgres_backend(locks)
    again = locks.lock("again")
    await again.acquire()
    first = await pg.holder_pid("again")
    await again.release()
    await again.acquire()
    assert first is not None and await pg.holder_pid("again") == first
    await again.release()
    held = [locks.lock(f"kept-{i}") for i in range(3)]
    for lock in held:
        await lock.acquire()
        assert await pg.holder_pid(lock.name) == first
    pool = backend.pool
    assert pool is not None
    for lock in held:
        await lock.release()
    assert pool.get_idle_size() < pool.get_size() - 1  # the session is kept a moment

    async def back() -> bool:
        return bool(pool.get_idle_size() == pool.get_size() - 1)  # all but the listening session

    await until(back, "the unused session went back to the pool", scaled(5) + 2 * PARK_TIME)
    assert await pg.granted_to(locks) == []
    conns = [await pool.acquire() for _ in range(pool.get_idle_size())]
    try:
        for conn in conns:
            assert not (await conn.fetchval("SHOW application_name")).startswith("asynclock")
            assert await conn.fetchval("SHOW idle_session_timeout") == "0"
    finally:
        for conn in conns:
            await pool.release(conn)


async def test_url_options_and_a_configured_table(pg: PostgresHarness) -> None:
    admin = await pg.admin()
    schema = f"{pg.prefix}_s"
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        locks = pg.connect(ttl=TTL, table=f"{schema}.fences")
        async with locks.lock("t") as lease:
            assert isinstance(lease.token, int)
        # the name is registered in the configured table (names() reads it)
        assert await admin.fetchval(f'SELECT count(*) FROM "{schema}".fences WHERE name = $1', b"t") == 1
        # options also come in the URL, and do not reach the server as settings
        sep = "&" if "?" in pg.url else "?"
        url = f"{pg.url}{sep}max_leases=3&table={schema}.from_url&prefix={pg.prefix}&ttl={TTL}"
        async with asynclock.connect(url) as url_locks:
            assert postgres_backend(url_locks).max_leases == 3
            assert url_locks.ttl == TTL
            async with url_locks.lock("t") as second:
                assert isinstance(second.token, int)
        assert await admin.fetchval(f'SELECT count(*) FROM "{schema}".from_url WHERE name = $1', b"t") == 1
        # every table and sequence is unlogged: a token costs the acquire no WAL
        persistence = await admin.fetch(
            "SELECT relname, relpersistence FROM pg_class WHERE relnamespace = $1::regnamespace"
            " AND relkind IN ('r', 'S') ORDER BY relname",
            schema,
        )
        assert {row[0] for row in persistence} >= {"fences", "fences_queue", "fences_token", "from_url"}
        assert {row[1] for row in persistence} == {b"u"}
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


# -- the queue ------------------------------------------------------------------


async def test_an_uncontended_acquire_and_release_run_in_the_callers_task(pg: PostgresHarness) -> None:
    # The try is one statement awaited by the caller, and the release one more:
    # neither starts a task (a task per request costs loop turns, and a
    # cancelled caller could not stop it).
    locks = pg.connect(ttl=TTL)
    lock = locks.lock("inline")
    await lock.acquire()
    await lock.release()  # the client has started, and a connection is parked
    loop = asyncio.get_running_loop()
    made: list[str] = []
    default = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: object, **kwargs: object) -> asyncio.Task[object]:
        made.append(getattr(coro, "__qualname__", repr(coro)))
        task = default(loop, coro, **kwargs) if default is not None else asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]
        return task  # type: ignore[return-value]

    loop.set_task_factory(counting)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            await lock.acquire(timeout=0)
            await lock.release()
    finally:
        loop.set_task_factory(default)
    assert made == []


async def test_waiters_wait_in_the_queue_table_without_a_session_each(pg: PostgresHarness) -> None:
    # A waiter is a row in the queue table: no session of the waiting client
    # sits in a lock wait, and its timeout takes the row out again.
    holder = pg.connect(ttl=TTL)
    waiter = pg.connect(ttl=TTL)
    async with holder.lock("queue"):
        task = asyncio.create_task(waiter.lock("queue").acquire(timeout=scaled(0.8)))
        await queued(pg, "queue", 1)
        info = await holder.lock("queue").info()
        assert info.waiters == 1
        assert await pg.lock_waits() == 0
        with pytest.raises(LockTimeout):
            await task
        assert await waiting_on(pg, "queue") == 0


async def test_timeout_zero_is_one_try_and_never_queues(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=TTL)
    other = pg.connect(ttl=TTL)
    async with holder.lock("try") as held:
        for _ in range(5):
            with pytest.raises(LockTimeout):
                await other.lock("try").acquire(timeout=0)
            assert await waiting_on(pg, "try") == 0
    lease = await other.lock("try").acquire(timeout=0)
    assert lease.token is not None and held.token is not None and lease.token > held.token
    await other.lock("try").release()


async def test_the_next_waiter_is_woken_by_the_release_at_once(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=scaled(30))  # a long ttl: only the release can let the waiter in
    waiter = pg.connect(ttl=scaled(30))
    order: list[str] = []
    lock = holder.lock("handoff")
    await lock.acquire()
    task = asyncio.create_task(_acquire_then(waiter, "handoff", order))
    await queued(pg, "handoff", 1)
    order.append("released")
    await lock.release()
    async with asyncio.timeout(scaled(2)):
        await task
    assert order == ["released", "acquired"]


async def _acquire_then(locks: asynclock.Locks, name: str, order: list[str]) -> None:
    async with locks.lock(name):
        order.append("acquired")


async def test_a_lease_won_after_a_long_wait_counts_from_the_grant(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=TTL)
    waiter = pg.connect(ttl=TTL)
    loop = asyncio.get_running_loop()
    lock = holder.lock("long")
    await lock.acquire()
    task = asyncio.create_task(waiter.lock("long").acquire(detached=True))  # outlives that task
    await queued(pg, "long", 1)
    await asyncio.sleep(TTL * 1.5)  # longer than the waiter's whole ttl
    await lock.release()
    lease = await asyncio.wait_for(task, scaled(5))
    got_at = loop.time()
    # the new lease is good for about a ttl from now, not from when it queued
    assert lease.expires_at > got_at
    assert not lease.lost
    await asyncio.sleep(TTL * 1.5)  # and the watchdog keeps it
    assert not lease.lost and await pg.holder_pid("long") is not None


async def test_reentry_takes_the_server_lock_once(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    lock = locks.lock("again")
    async with lock as lease, lock:
        assert lease.hold_count == 2
        info = await lock.info()
        assert info.hold_count == 2 and info.owner is not None
        admin = await pg.admin()
        high, low = unsigned(advisory_key(pg.prefix, "again"))
        granted = await admin.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted"
            " AND classid::int8 = $1 AND objid::int8 = $2",
            high,
            low,
        )
        assert granted == 1
    assert (await lock.info()).owner is None


async def test_info_names_the_holder_session_and_names_lists_held_locks(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    lock = locks.lock("who")
    assert (await lock.info()).owner is None
    async with lock as lease:
        info = await lock.info()
        assert info.owner is not None and info.owner.startswith(locks.client_id)
        assert info.token == lease.token and info.ttl is None and info.waiters == 0
        assert info.key == lock.key == "pg_advisory({},{})".format(*advisory_key(pg.prefix, "who"))
        pid = await pg.holder_pid("who")
        app = await (await pg.admin()).fetchval("SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid)
        assert app.startswith(f"asynclock {locks.client_id} ")
        assert await postgres_backend(locks).names() == ["who"]
    assert await postgres_backend(locks).names() == []


async def test_tokens_increase_across_clients_and_client_restarts(pg: PostgresHarness) -> None:
    tokens = []
    for _ in range(3):
        locks = pg.connect(ttl=TTL)
        for _ in range(2):
            async with locks.lock("fence") as lease:
                assert lease.token is not None
                tokens.append(lease.token)
        await locks.aclose()
    assert tokens == sorted(set(tokens)) and len(tokens) == 6


@pytest.mark.parametrize("source", ["sequence", "table"])
async def test_tokens_keep_increasing_after_a_server_crash(source: str) -> None:
    # Tokens come from unlogged objects (no WAL per acquire): a crash resets
    # them, whatever synchronous_commit says (off here). Three clients stay
    # connected through the crash and then ask at once, each for a name of its
    # own and all for a shared one: their first draws after the crash come
    # from the reset source and are never handed out; the source is seeded
    # from the clock once (the reseeds are serialised), and every token after
    # the crash is above every token before it.
    server = PostgresServer()  # its own: this test crashes it
    try:
        server.start()
        history: dict[str, list[int]] = {}

        async def hold(locks: asynclock.Locks, name: str) -> None:
            async with locks.lock(name) as lease:
                assert lease.token is not None
                history.setdefault(name, []).append(lease.token)  # in the order of the holds

        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(tokens_from(asynclock.connect(server.url, ttl=TTL), source))
                for _ in range(3)
            ]
            for _ in range(2):
                for i, locks in enumerate(clients):
                    await hold(locks, "crash")
                    await hold(locks, f"own-{i}")
            await hold(clients[0], "listed")  # registers the name (names() lists it while held)
            before = max(max(tokens) for tokens in history.values())
            server.restart(crash=True)
            async with asyncio.timeout(scaled(30)):
                await asyncio.gather(
                    *(hold(locks, name) for i, locks in enumerate(clients) for name in (f"own-{i}", "crash"))
                )
            late = await stack.enter_async_context(tokens_from(asynclock.connect(server.url, ttl=TTL), source))
            await hold(late, "crash")
            # the crash emptied the fence table: the name is registered again by its next hold
            async with clients[0].lock("listed"):
                assert await postgres_backend(late).names() == ["listed"]
        for name, tokens in history.items():
            assert tokens == sorted(set(tokens)), (name, tokens)
        after = [token for tokens in history.values() for token in tokens if token > before]
        assert len(after) == 7  # every hold after the crash: three of own names, four of "crash"
        # (and "listed": held before the crash only, then once more, not recorded)
        if source == "sequence":
            assert min(after) >= FLOOR
        all_tokens = [token for tokens in history.values() for token in tokens]
        assert len(all_tokens) == len(set(all_tokens)) or source == "table"
    finally:
        server.stop()
        server.cleanup()


@pytest.mark.parametrize("source", ["sequence", "table"])
async def test_clients_creating_the_tables_at_once(pg: PostgresHarness, source: str) -> None:
    # Several clients start on a fresh prefix together: one creates the fence
    # table (with its epoch row), its queue and token sequence, the others find
    # them. On the table, every name counts from 1; the sequence gives every
    # hold a token of its own.
    clients = [tokens_from(pg.connect(ttl=TTL), source) for _ in range(4)]

    async def first_token(locks: asynclock.Locks, name: str) -> int | None:
        async with locks.lock(name) as lease:
            return lease.token

    tokens = await asyncio.gather(*(first_token(locks, f"start-{i}") for i, locks in enumerate(clients)))
    if source == "table":
        assert tokens == [1, 1, 1, 1]
    else:
        assert all(token is not None and token >= FLOOR for token in tokens) and len(set(tokens)) == 4
    admin = await pg.admin()
    rows = await admin.fetchval(f'SELECT count(*) FROM "{pg.prefix}_fence"')
    assert rows == 5  # four names and the epoch row
    async with clients[0].lock("start-0"):
        assert await postgres_backend(clients[1]).names() == ["start-0"]  # the epoch row is no name


async def test_names_with_nul_and_unicode_are_distinct(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    names = ["a\x00b", "a", "ünï/cødé", "a\x00c"]
    leases = [await locks.lock(name).acquire(timeout=scaled(2)) for name in names]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(set(tokens))  # (None is no token: it would fail here)
    assert sorted(await postgres_backend(locks).names()) == sorted(names)
    for name in names:
        await locks.lock(name).release()


async def test_twenty_waiters_cost_no_connection_each_and_get_it_in_queue_order(pg: PostgresHarness) -> None:
    # Twenty tasks of one client wait: twenty rows in the queue table, no
    # session in a server lock wait, two connections for the whole client (its
    # session and its listening one); the release hands the lock down the
    # line in the order they queued.
    holder = pg.connect(ttl=TTL)
    waiter = pg.connect(ttl=TTL)
    held = await holder.lock("twenty").acquire()
    order: list[int] = []

    async def wait_then_release(i: int) -> None:
        lease = await waiter.lock("twenty").acquire(timeout=scaled(30), detached=True)
        order.append(i)
        await lease.release()

    tasks = []
    for i in range(20):
        tasks.append(asyncio.create_task(wait_then_release(i)))
        await queued(pg, "twenty", i + 1)
    assert await pg.lock_waits() == 0
    assert (await holder.lock("twenty").info()).waiters == 20
    pool = postgres_backend(waiter).pool
    assert pool is not None and pool.get_size() <= 2
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(30))
    assert order == list(range(20))
    assert await waiting_on(pg, "twenty") == 0


async def test_a_release_tells_one_waiter_to_try(pg: PostgresHarness) -> None:
    # No herd: ten waiters of two clients, and each of the ten hand-overs
    # sends one "try now" (to the first in line), whatever the queue's length.
    holder = pg.connect(ttl=TTL)
    waiters = [pg.connect(ttl=TTL) for _ in range(2)]
    told: list[str] = []
    for locks in waiters:
        listener = pg_listener(locks)
        real = listener.on_message

        def counting(payload: str, real: Callable[[str], None] = real) -> None:
            told.append(payload.split(" ", 1)[0])
            real(payload)

        listener.on_message = counting
    held = await holder.lock("herd").acquire()

    async def wait_then_release(locks: asynclock.Locks) -> None:
        lease = await locks.lock("herd").acquire(timeout=scaled(30), detached=True)
        await lease.release()

    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(wait_then_release(waiters[i % 2])))
        await queued(pg, "herd", i + 1)
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(30))
    assert told.count("t") == 10
    assert told.count("h") <= 10


async def test_a_waiters_listening_session_ends_and_it_queues_again(pg: PostgresHarness) -> None:
    # The listening session keeps its client's queue rows live. When it ends,
    # those rows are dead (passed over), the session is opened again, and the
    # waiter queues again under it: it still gets the lock at the release.
    holder = pg.connect(ttl=TTL)
    waiter = pg.connect(ttl=TTL)
    held = await holder.lock("relisten").acquire()
    task = asyncio.create_task(waiter.lock("relisten").acquire(timeout=scaled(10)))
    await queued(pg, "relisten", 1)
    listener = pg_listener(waiter)
    first = listener.incarnation
    await (await pg.admin()).fetchval("SELECT pg_terminate_backend($1)", listener.conn.get_server_pid())

    async def queued_again() -> bool:
        return listener.incarnation > first and await waiting_on(pg, "relisten") == 1

    await until(queued_again, "the waiter queued again under a new listening session")
    await held.release()
    lease = await asyncio.wait_for(task, scaled(10))
    assert lease.token is not None and held.token is not None and lease.token > held.token


async def test_holds_share_sessions_and_a_sessions_end_loses_exactly_its_holds(pg: PostgresHarness) -> None:
    # Thirty holds taken at once share at most max_leases sessions. Ending one
    # session (pg_terminate_backend) loses the holds on it, each with a "lost"
    # event (LockLost for a body under it) at once; the others keep theirs,
    # on the server too.
    events: list[asynclock.LockEvent] = []
    # (a long ttl: only the session's end can lose a hold this soon)
    locks = pg.connect(ttl=scaled(30), max_leases=3, on_event=events.append)
    other = pg.connect(ttl=TTL)
    names = [f"share-{i}" for i in range(30)]
    leases = await asyncio.wait_for(
        asyncio.gather(*(locks.lock(name).acquire(detached=True) for name in names)), scaled(10)
    )
    by_name = dict(zip(names, leases, strict=True))
    on: dict[int, list[str]] = {}
    for name in names:
        pid = await pg.holder_pid(name)
        assert pid is not None
        on.setdefault(pid, []).append(name)
    assert 2 <= len(on) <= 3, on  # shared (and, taken at once, by more than one session)
    # a body running under a hold of the session that ends is cancelled, with LockLost
    body = asyncio.create_task(_hold_a_while(locks, "body"))
    await until(lambda: _held(pg, "body"), "the body holds its lock")
    victim = await pg.holder_pid("body")
    assert victim in on
    gone = on[victim]
    kept = [name for name in names if name not in gone]
    await (await pg.admin()).fetchval("SELECT pg_terminate_backend($1)", victim)
    for name in gone:
        reason = await asyncio.wait_for(by_name[name].wait_lost(), scaled(5))
        assert "closed" in reason
    with pytest.raises(LockLost):
        await asyncio.wait_for(body, scaled(5))
    await asyncio.sleep(scaled(0.2))
    lost = {event.name for event in events if event.kind == "lost"}
    assert lost == {*gone, "body"}
    for name in kept:
        assert not by_name[name].lost
        assert await pg.holder_pid(name) in on
        with pytest.raises(LockTimeout):
            await other.lock(name).acquire(timeout=0)
    for name in gone:
        async with other.lock(name, ttl=TTL):
            pass
    for name in kept:
        await by_name[name].release()


async def _hold_a_while(locks: asynclock.Locks, name: str) -> None:
    async with locks.lock(name):
        await asyncio.sleep(scaled(30))


async def _held(pg: PostgresHarness, name: str) -> bool:
    return await pg.holder_pid(name) is not None


# -- hash collisions ---------------------------------------------------------


@pytest.mark.parametrize("source", ["sequence", "table"])
async def test_colliding_names_keep_mutual_exclusion_and_their_own_tokens(pg: PostgresHarness, source: str) -> None:
    clients = [tokens_from(pg.connect(ttl=TTL), source) for _ in range(3)]
    shared = advisory_key(pg.prefix, "collision")
    for locks in clients:
        # force "left" and "right" onto one advisory key; every other name keeps its own
        share_key(locks, ("left", "right"), shared)
    assert clients[0].lock("left").key == clients[0].lock("right").key

    inside = {"left": 0, "right": 0}
    peak = {"left": 0, "right": 0}
    tokens: dict[str, list[int]] = {"left": [], "right": []}

    async def worker(locks: asynclock.Locks, name: str) -> None:
        for _ in range(4):
            async with locks.lock(name) as lease:
                inside[name] += 1
                peak[name] = max(peak[name], inside[name])
                assert lease.token is not None
                tokens[name].append(lease.token)
                await asyncio.sleep(0.002)
                inside[name] -= 1

    workers = [worker(clients[i % 3], name) for i in range(3) for name in ("left", "right")]
    await asyncio.wait_for(asyncio.gather(*workers), scaled(30))
    assert peak == {"left": 1, "right": 1}
    # each name's tokens increase with each of its 12 holds (the table: its own counter, 1..12)
    for name in ("left", "right"):
        assert tokens[name] == sorted(set(tokens[name])) and len(tokens[name]) == 12
        if source == "table":
            assert tokens[name] == list(range(1, 13))

    # while "left" is held, info tells the names apart (the colliding name is not "held")...
    async with clients[0].lock("left"):
        left, right = await clients[1].lock("left").info(), await clients[1].lock("right").info()
        assert left.owner is not None and left.owner.startswith(clients[0].client_id)
        assert right.owner is None
        # ...though the collision makes "right" wait for "left" (more exclusion, never less)
        with pytest.raises(LockTimeout):
            await clients[1].lock("right").acquire(timeout=0)
    # a name without a collision is independent
    async with clients[0].lock("left"), clients[1].lock("elsewhere", ttl=TTL):
        pass


def test_the_key_is_stable_and_in_the_int4_range() -> None:
    key = advisory_key("asynclock", "orders:42")
    assert key == advisory_key("asynclock", "orders:42")
    assert key != advisory_key("other", "orders:42")
    assert all(-(2**31) <= part < 2**31 for part in key)


# -- the connection is the lease ----------------------------------------------


async def test_terminated_holder_connection_loses_the_lease_at_once(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=scaled(30))  # only the termination can end it this quickly
    other = pg.connect(ttl=TTL)
    order: list[str] = []
    with pytest.raises(LockLost):
        async with locks.lock("term") as lease:
            assert await pg.expire("term")
            try:
                await asyncio.sleep(scaled(20))
            except asyncio.CancelledError:
                order.append("holder cancelled")
                raise
    assert lease.lost and "closed" in (lease.lost_reason or "")
    async with asyncio.timeout(scaled(5)), other.lock("term") as successor:
        order.append("successor in")
        assert successor.token is not None and lease.token is not None and successor.token > lease.token
    assert order == ["holder cancelled", "successor in"]


async def test_renewal_pings_keep_many_leases_alive_past_the_ttl(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    names = [f"keep{i}" for i in range(5)]
    leases = [await locks.lock(name).acquire() for name in names]
    first_deadline = min(lease.expires_at for lease in leases)
    await asyncio.sleep(TTL * 2)
    assert not any(lease.lost for lease in leases)
    assert min(lease.expires_at for lease in leases) > first_deadline
    # the server kept every session: each lock is still granted to its holder
    for name in names:
        assert await pg.holder_pid(name) is not None
    for name in names:
        await locks.lock(name).release()


async def test_paused_server_cancels_the_holder_before_its_deadline(pg: PostgresHarness) -> None:
    locks = pg.connect(ttl=TTL)
    loop = asyncio.get_running_loop()
    seen: dict[str, float] = {}
    try:
        with pytest.raises(LockLost):
            async with locks.lock("stop") as lease:
                await asyncio.sleep(TTL / 6)
                pg.server.pause()
                seen["paused_at"] = loop.time()
                try:
                    await asyncio.sleep(scaled(20))
                except asyncio.CancelledError:
                    seen["cancelled_at"] = loop.time()
                    seen["deadline"] = lease.expires_at
                    raise
    finally:
        pg.server.resume()
    assert lease.lost and seen["cancelled_at"] >= seen["paused_at"]
    # Lost by the trusted deadline (no renewal got through), not by a
    # closed connection: the server was stopped, nothing could tell us.
    assert "deadline" in (lease.lost_reason or "")
    # once the server runs again the abandoned session ends; a new holder gets in
    other = pg.connect(ttl=TTL)
    async with asyncio.timeout(scaled(10)), other.lock("stop") as successor:
        assert successor.token is not None and lease.token is not None and successor.token > lease.token


async def test_a_silent_server_is_not_waited_for_forever(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=scaled(30))
    waiter = pg.connect(ttl=TTL)
    async with holder.lock("silent"):
        task = asyncio.create_task(waiter.lock("silent").acquire())  # timeout=None
        await queued(pg, "silent", 1)
        pg.server.pause()
        try:
            async with asyncio.timeout(scaled(10)):
                with pytest.raises(BackendUnavailable) as caught:
                    await task
        finally:
            pg.server.resume()
    assert not waiter.lock("silent").held
    assert f"127.0.0.1:{pg.server.port}: stopped answering" in str(caught.value)  # where, and what


async def test_a_try_to_a_silent_server_ends_within_the_ttl(pg: PostgresHarness) -> None:
    # The try of an uncontended acquire runs on a connection kept from the last
    # release; a server that stops answering it must not hold the caller past
    # the ttl, and the connection is closed (its session ends with it).
    locks = pg.connect(ttl=TTL)
    other = pg.connect(ttl=TTL)
    lock = locks.lock("mute")
    await lock.acquire()
    await lock.release()
    pg.server.pause()
    try:
        async with asyncio.timeout(scaled(5)):
            with pytest.raises(BackendUnavailable) as caught:
                await lock.acquire()  # timeout=None: only the ttl bounds the try
    finally:
        pg.server.resume()
    assert not lock.held
    assert f"127.0.0.1:{pg.server.port}" in str(caught.value)
    async with asyncio.timeout(scaled(5)), other.lock("mute") as lease:
        assert lease.token is not None


async def test_idle_session_timeout_ends_a_hung_holders_session(pg: PostgresHarness) -> None:
    # A holder whose process hangs sends no pings: the server ends its session
    # a ttl after its last statement, and the lock with it.
    locks = pg.connect(ttl=scaled(0.4))
    lease = await locks.lock("hung").acquire()
    insides.keeper(locks).remove(lease)  # as if the watchdog stopped (a hung process)
    assert await pg.holder_pid("hung") is not None

    async def freed() -> bool:
        return await pg.holder_pid("hung") is None

    await until(freed, "the server ended the idle session", scaled(5))
    reason = await asyncio.wait_for(lease.wait_lost(), scaled(5))
    assert lease.lost and reason


# -- cancellation ---------------------------------------------------------------


async def test_cancelled_waiter_leaves_the_queue_and_its_session_goes_back(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=TTL)
    waiter = pg.connect(ttl=TTL)
    backend = postgres_backend(waiter)
    async with holder.lock("leave"):
        for _ in range(3):
            task = asyncio.create_task(waiter.lock("leave").acquire())
            await queued(pg, "leave", 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await waiting_on(pg, "leave") == 0
            assert await pg.granted_to(waiter) == []
            pool = backend.pool
            assert pool is not None
            assert pool.get_size() - pool.get_idle_size() <= 2  # its session and its listening one

            async def back(pool: asyncpg.Pool = pool) -> bool:
                return bool(pool.get_size() - pool.get_idle_size() == 1)  # the listening session only

            await until(back, "the waiter's session went back to the pool", scaled(5) + 2 * PARK_TIME)
    assert await postgres_backend(waiter).names() == []


async def test_cancelling_contended_acquires_at_random_points_leaves_nothing(pg: PostgresHarness) -> None:
    a = pg.connect(ttl=TTL)
    b = pg.connect(ttl=TTL)
    rng = random.Random(5)
    got = cancelled = 0

    async def churn() -> None:
        # "a" takes and gives the lock back at random moments meanwhile
        while True:
            async with a.lock("chaos"):
                await asyncio.sleep(rng.uniform(0, 0.004))
            await asyncio.sleep(rng.uniform(0, 0.004))

    async def b_holds_nothing() -> bool:
        return await pg.granted_to(b) == []

    churner = asyncio.create_task(churn())
    try:
        for _ in range(80):
            task = asyncio.create_task(_hold_briefly(b, "chaos"))
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
            try:
                await task
                got += 1
            except asyncio.CancelledError:
                cancelled += 1
            # whatever happened, "b" holds nothing, and the server lets go of
            # anything it got right away (a release cut short by the
            # cancellation finishes in the background), long before a ttl
            assert not b.lock("chaos").held
            await until(b_holds_nothing, "b's sessions hold nothing", TTL / 3)
    finally:
        churner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await churner
    assert cancelled > 0
    await queued(pg, "chaos", 0)
    backend = postgres_backend(b)
    assert backend.pool is not None
    pool = backend.pool

    async def all_back() -> bool:
        return bool(pool.get_size() - pool.get_idle_size() == 1)  # the listening session only

    await until(all_back, "every session back in the pool", scaled(5) + 2 * PARK_TIME)


async def _hold_briefly(locks: asynclock.Locks, name: str) -> None:
    async with locks.lock(name):
        await asyncio.sleep(0.001)


async def test_closing_the_client_ends_its_queued_waits(pg: PostgresHarness) -> None:
    holder = pg.connect(ttl=TTL)
    waiter = asynclock.connect(pg.url, ttl=TTL, prefix=pg.prefix)
    async with holder.lock("closing"):
        task = asyncio.create_task(waiter.lock("closing").acquire())
        await queued(pg, "closing", 1)
        await asyncio.wait_for(waiter.aclose(), scaled(5))
        with pytest.raises(BackendUnavailable):
            await asyncio.wait_for(task, scaled(5))
        await queued(pg, "closing", 0)


async def test_release_to_a_paused_server_is_bounded_and_frees_the_lock_on_resume(pg: PostgresHarness) -> None:
    # a long ttl: only the closed connection, not the idle timeout, can free it this fast
    locks = pg.connect(ttl=scaled(30))
    other = pg.connect(ttl=TTL)
    lock = locks.lock("parting")
    first = await lock.acquire()
    pg.server.pause()
    try:
        async with asyncio.timeout(scaled(5)):
            # the server cannot confirm: the connection is closed instead
            with contextlib.suppress(BackendUnavailable):
                await lock.release()
        assert not lock.held
    finally:
        pg.server.resume()
    async with asyncio.timeout(scaled(5)), other.lock("parting") as lease:
        assert lease.token is not None and first.token is not None and lease.token > first.token


# -- the uncontended path --------------------------------------------------------


async def test_two_owners_on_the_fast_path_at_once_never_both_get_it(pg: PostgresHarness) -> None:
    # Two tasks of one client and a task of another try the same free lock at
    # the same instant, again and again: exactly one gets it each time, and
    # the tokens of the winners increase.
    a = pg.connect(ttl=TTL)
    b = pg.connect(ttl=TTL)
    tokens: list[int] = []
    for _ in range(20):
        tries = [a.lock("race"), a.lock("race"), b.lock("race")]

        async def attempt(lock: asynclock.Lock) -> asynclock.Lease | None:
            try:
                return await lock.acquire(timeout=0, detached=True)
            except LockTimeout:
                return None

        leases = await asyncio.gather(*(asyncio.create_task(attempt(lock)) for lock in tries))
        won = [lease for lease in leases if lease is not None]
        assert len(won) == 1
        assert won[0].token is not None
        tokens.append(won[0].token)
        await won[0].release()
    assert tokens == sorted(set(tokens))
    assert await pg.granted_to(a, b) == []


async def test_cancelling_an_uncontended_pair_at_each_await_leaves_nothing(pg: PostgresHarness) -> None:
    # The acquire is cancelled after 0, 1, 2, ... loop turns, so the
    # cancellation lands at each of its awaits in turn (the checkout, the try,
    # the answer), until the acquire finishes first; then the same for the
    # release. Whatever the cut, nothing stays locked that the client does not
    # know it holds, and the next acquire of another client gets the lock at once.
    locks = pg.connect(ttl=TTL)
    other = pg.connect(ttl=TTL)
    lock = locks.lock("cut")
    finished = False
    turns = 0
    while not finished:
        task = asyncio.create_task(lock.acquire(detached=True))
        for _ in range(turns):
            await asyncio.sleep(0)
        finished = task.done()
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            pass
        else:
            await lease.release()
        async with asyncio.timeout(scaled(5)):
            second = await other.lock("cut").acquire(timeout=scaled(2))
        await second.release()
        turns += 1
    assert turns > 2  # the acquire took several loop turns: several cut points were tried
    finished = False
    turns = 0
    while not finished:
        lease = await lock.acquire(detached=True)
        task = asyncio.create_task(lease.release())
        for _ in range(turns):
            await asyncio.sleep(0)
        finished = task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # A release cut before it sent anything leaves the lease held: released
        # again, it goes; one that went through is NotHeld now.
        with contextlib.suppress(asynclock.NotHeld):
            await lease.release()
        async with asyncio.timeout(scaled(5)):
            second = await other.lock("cut").acquire(timeout=scaled(2))
        await second.release()
        turns += 1
    assert await pg.granted_to(locks, other) == []


async def test_a_server_restart_between_acquire_and_release() -> None:
    # The holder's session ends with the server: the lease is lost at once
    # (LockLost out of the body), the release that follows is NotHeld and
    # sends nothing, and once the server is back a new holder gets a higher token.
    server = PostgresServer()  # its own: this test restarts it
    try:
        server.start()
        async with asynclock.connect(server.url, ttl=TTL) as locks:
            lock = locks.lock("restart")
            lease = await lock.acquire()
            assert lease.token is not None
            server.restart(crash=False)
            reason = await asyncio.wait_for(lease.wait_lost(), scaled(5))
            assert lease.lost and reason
            with pytest.raises(asynclock.NotHeld):
                await lock.release()
            async with asyncio.timeout(scaled(10)):
                again = await lock.acquire()
            assert again.token is not None and again.token > lease.token
            await again.release()
    finally:
        server.stop()
        server.cleanup()


async def test_a_lock_timeout_after_the_grant_gives_the_advisory_lock_back(pg: PostgresHarness) -> None:
    """``lock_timeout`` can end the acquire statement *after* the advisory lock was granted.

    The statement takes the lock first and then upserts the fence counter; if
    that row is locked (an application's ``SELECT ... FOR UPDATE`` on the
    table, a client with another prefix sharing the table), the row-lock wait
    hits ``lock_timeout``. The session-level advisory lock survives the
    statement's error, so it must be unlocked right away, or the name stays
    locked for as long as that session lives (it holds other clients' holds
    too, and the pool may keep it for long).
    """
    # (tokens from the table, as on servers before PostgreSQL 15)
    locks = tokens_from(pg.connect(ttl=TTL), "table")
    other = tokens_from(pg.connect(ttl=TTL), "table")
    async with locks.lock("row"):
        pass  # the fence row exists now
    admin = await pg.admin()
    table = f'"{pg.prefix}_fence"'
    tx = admin.transaction()
    await tx.start()
    try:
        await admin.execute(f"SELECT value FROM {table} WHERE name = $1 FOR UPDATE", b"row")
        with pytest.raises(LockTimeout):
            await locks.lock("row").acquire(timeout=scaled(0.3))
    finally:
        await tx.rollback()
    # nothing of the timed-out attempt is still granted, to anybody
    assert await pg.holder_pid("row") is None
    async with asyncio.timeout(scaled(5)):
        async with other.lock("row") as lease:
            assert lease.token == 2


async def test_a_session_ended_between_a_statements_prepare_and_its_run_is_unavailable(pg: PostgresHarness) -> None:
    """asyncpg fails such a request with AttributeError (no protocol any more): it is BackendUnavailable at
    the edge, as when a client closing ends its sessions under a request that waited for its turn; the
    same for a statement sent through the edge outside a hold's request (settling, reseeding)."""
    locks = pg.connect(ttl=TTL)
    async with locks.lock("warm"):
        pass
    running = pg_running(locks)
    assert running is not None

    class EndsAfterPrepare(asyncpg.Connection):  # type: ignore[misc]
        __slots__ = ()

        async def _get_statement(self, *args: Any, **kwargs: Any) -> Any:
            statement = await super()._get_statement(*args, **kwargs)
            self.terminate()  # (the statement is prepared: its run finds no connection)
            return statement

    session = await running.sessions.get(TTL)
    session.conn.__class__ = EndsAfterPrepare
    with pytest.raises(BackendUnavailable, match="the session was closed during a request"):
        await running.requests.run(session, TTL, asyncpg.Connection.fetchval, "SELECT 41 + $1::int", 1)
    async with asyncio.timeout(scaled(5)):
        while not session.gone:  # (told by the connection's termination listener, soon)
            await asyncio.sleep(0.01)
    session = await running.sessions.get(TTL)
    session.conn.__class__ = EndsAfterPrepare
    with pytest.raises(BackendUnavailable, match="the session was closed during a request"):
        async with running.requests.errors.edge:
            await session.conn.fetchval("SELECT 41 + $1::int", 1)
    # an AttributeError of anything else passes the edge unchanged
    with pytest.raises(AttributeError, match="no_such_thing"):
        async with running.requests.errors.edge:
            _ = session.no_such_thing  # type: ignore[attr-defined]
