"""Fences (``asynclock.fencing``) on real servers: Redis, Redis Cluster and PostgreSQL
stores, the interleavings of writers with older and newer tokens, and the paused
holder whose write a fence refuses and whose unfenced write overwrites the next
holder's."""

from __future__ import annotations

import asyncio
import random
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

import asynclock
from asynclock.backends import memory
from asynclock.fencing import PostgresFence, RedisFence, StaleToken
from asynclock.testing import faults
from tests.conftest import make_harness
from tests.fenced_holder import NAME, Config, HolderProcess, HolderThread, open_store
from tests.servers import RedisServer, scaled
from tests.servers.base import free_port
from tests.servers.postgres import PostgresServer
from tests.servers.proxy import TcpProxy
from tests.servers.redis_topologies import ClusterSetup

pytestmark = pytest.mark.anyio

TTL = scaled(1.0)


class NoToken:
    """A lease as Redlock gives it: no fencing token."""

    name = "orders:42"
    token = None
    lost = False


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def tag() -> str:
    """A prefix of this test's own, for its keys, marks and tables."""
    return f"f{secrets.token_hex(3)}"


@pytest.fixture
async def memory_locks() -> AsyncIterator[asynclock.Locks]:
    async with asynclock.connect("memory://", ttl=TTL, prefix=f"m{secrets.token_hex(3)}") as locks:
        yield locks


def nowhere() -> aioredis.Redis:
    """A client of a port nobody listens on: any I/O through it fails."""
    return aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)


async def lost_lease(locks: asynclock.Locks, name: str = NAME) -> asynclock.Lease:
    lease = await locks.lock(name).acquire(detached=True)
    faults(locks).lose(name)
    assert lease.lost
    return lease


def test_the_module_needs_neither_redis_nor_asyncpg_to_import() -> None:
    code = (
        "import sys; sys.modules['redis'] = sys.modules['asyncpg'] = None; "
        "from asynclock.fencing import PostgresFence, StaleToken; PostgresFence(); "
        "import asynclock; assert issubclass(StaleToken, asynclock.LockLost); print(StaleToken)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "<class 'asynclock.fencing.StaleToken'>"


# -- arguments, refused before any I/O ---------------------------------------------


async def test_a_lease_known_lost_is_refused_before_any_io(memory_locks: asynclock.Locks) -> None:
    lease = await lost_lease(memory_locks)
    client = nowhere()
    with pytest.raises(StaleToken) as refused:
        await RedisFence(client).call(lease, "SET", "k", "v")
    assert refused.value.mark is None and refused.value.token == lease.token
    assert refused.value.resource == refused.value.name == NAME
    assert "lost before the write" in str(refused.value)
    assert isinstance(refused.value, asynclock.LockLost)
    await client.aclose()


async def test_postgres_refuses_a_lease_known_lost_before_any_io(
    memory_locks: asynclock.Locks, postgres_server: PostgresServer
) -> None:
    lease = await lost_lease(memory_locks)
    conn = await asyncpg.connect(postgres_server.dsn)
    await conn.close()  # any statement on it would raise InterfaceError
    with pytest.raises(StaleToken):
        await PostgresFence().advance(conn, lease)


async def test_bad_arguments_are_refused_before_any_io(memory_locks: asynclock.Locks) -> None:
    client = nowhere()
    fence = RedisFence(client)
    with pytest.raises(TypeError, match="resource="):
        await fence.call(17, "SET", "k", "v")
    with pytest.raises(TypeError, match="Lease, a Term or an int"):
        await fence.call(True, "SET", "k", "v", resource="r")
    with pytest.raises(TypeError, match="Lease, a Term or an int"):
        await fence.call("17", "SET", "k", "v", resource="r")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="never negative"):
        await fence.call(-1, "SET", "k", "v", resource="r")
    with pytest.raises(ValueError, match="non-empty"):
        await fence.call(1, "SET", "k", "v", resource="")
    with pytest.raises(ValueError, match="no fencing token"):
        await fence.call(NoToken(), "SET", "k", "v")  # type: ignore[arg-type]
    lease = await memory_locks.lock("held").acquire(detached=True)
    with pytest.raises(TypeError, match="needs a command"):
        await fence.call(lease)
    with pytest.raises(TypeError, match=r"redis\.asyncio client"):
        RedisFence(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        RedisFence(client, prefix="a{b}")
    with pytest.raises(ValueError, match=r"schema\.name"):
        PostgresFence(table="a.b.c")
    with pytest.raises(ValueError, match="bigint"):
        await PostgresFence().advance(object(), 2**63, resource="r")
    with pytest.raises(TypeError, match="asyncpg connection"):
        await PostgresFence().advance(object(), 1, resource="r")
    await lease.release()
    await client.aclose()


# -- RedisFence on one server --------------------------------------------------------


async def test_redis_runs_a_fresh_command_and_returns_its_reply(store: aioredis.Redis, tag: str) -> None:
    fence = RedisFence(store, prefix=tag)
    key = f"{tag}:data"
    assert await fence.call(5, "SET", key, "v5", resource="r") == b"OK"
    assert await fence.call(5, "GET", key, resource="r") == b"v5"  # the same holder again: equal passes
    assert await fence.call(6, "HSET", f"{key}:h", "a", 1, "b", 2, resource="r") == 2
    assert await fence.call(6, "HGETALL", f"{key}:h", resource="r") == [b"a", b"1", b"b", b"2"]
    assert await fence.call(6, "GET", f"{key}:missing", resource="r") is None
    assert await store.get(fence.mark_key("r")) == b"6"
    assert fence.mark_key("r") == f"{tag}:{{r}}:mark"
    await store.delete(key, f"{key}:h", fence.mark_key("r"))


async def test_redis_refuses_an_older_token_and_runs_nothing(store: aioredis.Redis, tag: str) -> None:
    fence = RedisFence(store, prefix=tag)
    key = f"{tag}:data"
    await fence.call(9, "SET", key, "newer", resource="r")
    with pytest.raises(StaleToken) as refused:
        await fence.call(8, "SET", key, "older", resource="r")
    assert (refused.value.token, refused.value.mark, refused.value.resource) == (8, 9, "r")
    assert refused.value.loss is asynclock.LossReason.TAKEN_OR_EXPIRED
    assert await store.get(key) == b"newer"
    assert await store.get(fence.mark_key("r")) == b"9"
    # another resource has a mark of its own
    assert await fence.call(1, "SET", f"{key}:other", "x", resource="other") == b"OK"
    await store.delete(key, f"{key}:other", fence.mark_key("r"), fence.mark_key("other"))


async def test_redis_compares_tokens_exactly_past_two_to_the_53(store: aioredis.Redis, tag: str) -> None:
    """Lua numbers are doubles: 2**60 + 1 and 2**60 + 2 are one number there, and
    999 against 1000 is a trap for a comparison of strings."""
    fence = RedisFence(store, prefix=tag)
    await fence.call(999, "SET", f"{tag}:k", "a", resource="r")
    await fence.call(1000, "SET", f"{tag}:k", "b", resource="r")
    with pytest.raises(StaleToken):
        await fence.call(999, "SET", f"{tag}:k", "c", resource="r")
    big = 2**60
    await fence.call(big + 2, "SET", f"{tag}:k", "d", resource="r")
    with pytest.raises(StaleToken) as refused:
        await fence.call(big + 1, "SET", f"{tag}:k", "e", resource="r")
    assert refused.value.mark == big + 2
    assert await fence.call(2**70, "GET", f"{tag}:k", resource="r") == b"d"
    await store.delete(f"{tag}:k", fence.mark_key("r"))


async def test_redis_a_command_that_fails_raises_no_mark(store: aioredis.Redis, tag: str) -> None:
    fence = RedisFence(store, prefix=tag)
    await fence.call(3, "HSET", f"{tag}:h", "f", "v", resource="r")
    with pytest.raises(aioredis.ResponseError, match="WRONGTYPE"):
        await fence.call(4, "INCR", f"{tag}:h", resource="r")
    assert await store.get(fence.mark_key("r")) == b"3"
    await store.delete(f"{tag}:h", fence.mark_key("r"))


async def test_redis_concurrent_writers_apply_in_token_order(redis_server: RedisServer, tag: str) -> None:
    """Writers with shuffled tokens race on several connections: the writes applied
    (in the order the server applied them) never go back to an older token, and each
    refused writer's token is older than one applied before it."""
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(4)]
    tokens = list(range(1, 61))
    random.Random(7).shuffle(tokens)
    log = f"{tag}:{{r}}:log"

    async def write(index: int, token: int) -> int | None:
        fence = RedisFence(clients[index % len(clients)], prefix=tag)
        try:
            await fence.call(token, "RPUSH", log, token, resource="r")
        except StaleToken as stale:
            assert stale.mark is not None and stale.mark > token
            return None
        return token

    results = await asyncio.gather(*(write(i, token) for i, token in enumerate(tokens)))
    applied = [int(x) for x in await clients[0].lrange(log, 0, -1)]
    assert applied == sorted(applied)
    assert sorted(applied) == sorted(t for t in results if t is not None)
    assert applied[-1] == max(tokens)
    assert len(applied) < len(tokens)  # writers came out of order, and the fence told them apart
    assert await clients[0].get(f"{tag}:{{r}}:mark") == str(max(tokens)).encode()
    await clients[0].delete(log, f"{tag}:{{r}}:mark")
    for client in clients:
        await client.aclose()


async def test_redis_a_lease_or_a_term_writes_under_its_name(
    redis_server: RedisServer, store: aioredis.Redis, tag: str
) -> None:
    """The lock on the store's own Redis: the lease's name is the resource, unless resource= says otherwise."""
    fence = RedisFence(store, prefix=tag)
    async with asynclock.connect(redis_server.url, ttl=TTL, prefix=tag) as locks:
        async with locks.lock("orders:7") as lease:
            assert lease.token is not None
            await fence.call(lease, "SET", f"{tag}:{{orders:7}}:state", "paid")
            await fence.call(lease, "SET", f"{tag}:elsewhere", "x", resource="ledger")
        assert await store.get(fence.mark_key("orders:7")) == str(lease.token).encode()
        assert await store.get(fence.mark_key("ledger")) == str(lease.token).encode()
        async with locks.election("scheduler", identity="me").leadership() as term:
            assert term.token is not None
            await fence.call(term, "SET", f"{tag}:{{scheduler}}:state", "ran")
        assert await store.get(fence.mark_key("scheduler")) == str(term.token).encode()
    await store.delete(*[k async for k in store.scan_iter(match=f"{tag}*")])


# -- RedisFence on Redis Cluster -------------------------------------------------------


@pytest.fixture
async def cluster_store(redis_cluster: ClusterSetup) -> AsyncIterator[aioredis.RedisCluster]:
    client = aioredis.RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", s.port) for s in redis_cluster.servers])
    yield client
    await client.aclose()


async def test_cluster_runs_commands_on_keys_tagged_like_the_mark(
    cluster_store: aioredis.RedisCluster, tag: str
) -> None:
    fence = RedisFence(cluster_store, prefix=tag)
    resource = f"{tag}-orders:42"
    state, items = f"{{{resource}}}:state", f"{{{resource}}}:items"
    assert await fence.call(5, "SET", state, "paid", resource=resource) == b"OK"
    assert await fence.call(5, "MSET", state, "shipped", items, "3", resource=resource) == b"OK"
    assert await fence.call(5, "MGET", state, items, resource=resource) == [b"shipped", b"3"]
    with pytest.raises(StaleToken):
        await fence.call(4, "SET", state, "older", resource=resource)
    assert await cluster_store.get(state) == b"shipped"
    assert cluster_store.keyslot(fence.mark_key(resource)) == cluster_store.keyslot(state)
    await cluster_store.delete(state, items, fence.mark_key(resource))


async def test_cluster_refuses_a_key_of_another_slot_naming_the_hash_tag(
    cluster_store: aioredis.RedisCluster, tag: str
) -> None:
    fence = RedisFence(cluster_store, prefix=tag)
    resource = f"{tag}-orders:42"
    other = f"{tag}-untagged-state"
    assert cluster_store.keyslot(other) != cluster_store.keyslot(fence.mark_key(resource))
    with pytest.raises(ValueError, match=rf"hash tag \{{{resource}\}}"):
        await fence.call(5, "SET", other, "paid", resource=resource)
    with pytest.raises(ValueError, match="hash tag"):
        await fence.call(5, "MSET", f"{{{resource}}}:a", "1", other, "2", resource=resource)
    # nothing ran, not even the mark
    assert await cluster_store.exists(other, f"{{{resource}}}:a", fence.mark_key(resource)) == 0


async def test_cluster_lock_and_fence_on_one_cluster(redis_cluster: ClusterSetup, tag: str) -> None:
    """The lock on a Redis Cluster, the fence on the same: keys tagged with the lock's name
    share the slot of its mark (and of the lock's own keys)."""
    client = aioredis.RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", s.port) for s in redis_cluster.servers])
    fence = RedisFence(client, prefix=tag)
    async with asynclock.connect(redis_cluster.url, ttl=TTL, prefix=tag) as locks:
        async with locks.lock("orders:42") as lease:
            await fence.call(lease, "HSET", "{orders:42}:" + tag, "state", "paid")
    assert await client.hget("{orders:42}:" + tag, "state") == b"paid"
    assert await client.get(fence.mark_key("orders:42")) == str(lease.token).encode()
    await client.delete("{orders:42}:" + tag, fence.mark_key("orders:42"))
    await client.aclose()


# -- PostgresFence -----------------------------------------------------------------------


@pytest.fixture
async def pg(postgres_server: PostgresServer, tag: str) -> AsyncIterator[Any]:
    """A connection, with an ``orders`` table of this test (order 42 'new') and a fence table name."""
    conn = await asyncpg.connect(postgres_server.dsn)
    await conn.execute(f"CREATE TABLE {tag}_orders (id int PRIMARY KEY, state text)")
    await conn.execute(f"INSERT INTO {tag}_orders VALUES (42, 'new')")
    yield conn
    await conn.execute(f"DROP TABLE IF EXISTS {tag}_orders, {tag}_fences")
    await conn.close()


@pytest.fixture
async def pg2(postgres_server: PostgresServer) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(postgres_server.dsn)
    yield conn
    await conn.close()


async def state(conn: Any, tag: str) -> str:
    value: str = await conn.fetchval(f"SELECT state FROM {tag}_orders WHERE id = 42")
    return value


async def test_postgres_advances_in_the_callers_transaction(pg: Any, tag: str) -> None:
    fence = PostgresFence(table=f"{tag}_fences")
    assert not await pg.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{tag}_fences")
    async with pg.transaction():
        await fence.advance(pg, 5, resource="orders:42")  # creates the table
        await pg.execute(f"UPDATE {tag}_orders SET state = 'paid' WHERE id = 42")
    async with pg.transaction():
        await fence.advance(pg, 5, resource="orders:42")  # the same holder again: equal passes
    assert await pg.fetchval(f"SELECT token FROM {tag}_fences WHERE resource = 'orders:42'") == 5
    with pytest.raises(StaleToken) as refused:
        async with pg.transaction():
            await pg.execute(f"UPDATE {tag}_orders SET state = 'older' WHERE id = 42")
            await fence.advance(pg, 4, resource="orders:42")
    assert (refused.value.token, refused.value.mark) == (4, 5)
    assert await state(pg, tag) == "paid"  # the rollback undid the write made before the refusal
    async with pg.transaction():
        await fence.advance(pg, 6, resource="orders:42")
    assert await pg.fetchval(f"SELECT token FROM {tag}_fences WHERE resource = 'orders:42'") == 6


async def test_postgres_needs_a_transaction_and_does_no_io_without_one(pg: Any, tag: str) -> None:
    fence = PostgresFence(table=f"{tag}_fences")
    with pytest.raises(ValueError, match="inside the transaction"):
        await fence.advance(pg, 5, resource="orders:42")
    assert not await pg.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{tag}_fences")


async def test_postgres_a_newer_holder_first_makes_the_older_stale(pg: Any, pg2: Any, tag: str) -> None:
    """The newer holder's advance is not committed yet: the older one waits on the mark's
    row, and once the newer commits it is refused."""
    newer, older = PostgresFence(table=f"{tag}_fences"), PostgresFence(table=f"{tag}_fences")
    async with pg.transaction():
        await newer.advance(pg, 1, resource="orders:42")  # (the table and the row exist)
    first = pg.transaction()
    await first.start()
    await newer.advance(pg, 9, resource="orders:42")
    await pg.execute(f"UPDATE {tag}_orders SET state = 'by 9' WHERE id = 42")
    second = pg2.transaction()
    await second.start()
    waiting = asyncio.create_task(older.advance(pg2, 5, resource="orders:42"))
    await asyncio.sleep(scaled(0.3))
    assert not waiting.done()  # the newer holder's row lock holds it
    await first.commit()
    with pytest.raises(StaleToken) as refused:
        await waiting
    await second.rollback()
    assert refused.value.mark == 9
    assert await state(pg, tag) == "by 9"


async def test_postgres_an_older_holder_first_is_then_followed_by_the_newer(pg: Any, pg2: Any, tag: str) -> None:
    older, newer = PostgresFence(table=f"{tag}_fences"), PostgresFence(table=f"{tag}_fences")
    async with pg.transaction():
        await older.advance(pg, 1, resource="orders:42")
    first = pg.transaction()
    await first.start()
    await older.advance(pg, 5, resource="orders:42")
    await pg.execute(f"UPDATE {tag}_orders SET state = 'by 5' WHERE id = 42")
    second = pg2.transaction()
    await second.start()
    waiting = asyncio.create_task(newer.advance(pg2, 9, resource="orders:42"))
    await asyncio.sleep(scaled(0.3))
    assert not waiting.done()
    await first.commit()
    await waiting  # after the older holder's write, the newer one's
    await pg2.execute(f"UPDATE {tag}_orders SET state = 'by 9' WHERE id = 42")
    await second.commit()
    assert await state(pg, tag) == "by 9"


async def test_postgres_a_newer_holder_that_rolls_back_leaves_the_older_fresh(pg: Any, pg2: Any, tag: str) -> None:
    newer, older = PostgresFence(table=f"{tag}_fences"), PostgresFence(table=f"{tag}_fences")
    async with pg.transaction():
        await newer.advance(pg, 1, resource="orders:42")
    first = pg.transaction()
    await first.start()
    await newer.advance(pg, 9, resource="orders:42")
    second = pg2.transaction()
    await second.start()
    waiting = asyncio.create_task(older.advance(pg2, 5, resource="orders:42"))
    await asyncio.sleep(scaled(0.3))
    assert not waiting.done()
    await first.rollback()
    await waiting
    await second.commit()
    assert await pg.fetchval(f"SELECT token FROM {tag}_fences WHERE resource = 'orders:42'") == 5


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_postgres_two_first_uses_race_to_create_the_table(pg: Any, pg2: Any, tag: str, outcome: str) -> None:
    """The first creator's transaction is still open when the second looks: the second
    waits for it, then finds the table made (or makes it, if the first rolled back)."""
    table = f"{tag}_fences"
    first = pg.transaction()
    await first.start()
    await PostgresFence(table=table).advance(pg, 5, resource="a")
    second = pg2.transaction()
    await second.start()
    waiting = asyncio.create_task(PostgresFence(table=table).advance(pg2, 7, resource="b"))
    await asyncio.sleep(scaled(0.3))
    assert not waiting.done()
    await (first.commit() if outcome == "commit" else first.rollback())
    await waiting
    await pg2.execute("SELECT 1")  # the caller's transaction is still usable
    await second.commit()
    marks = dict(await pg.fetch(f"SELECT resource, token FROM {table}"))
    assert marks == ({"a": 5, "b": 7} if outcome == "commit" else {"b": 7})


async def test_postgres_schema_qualified_table(pg: Any, tag: str) -> None:
    fence = PostgresFence(table=f"public.{tag}_fences")
    async with pg.transaction():
        await fence.advance(pg, 3, resource="r")
    assert await pg.fetchval(f"SELECT token FROM public.{tag}_fences") == 3


async def test_postgres_repeatable_read_reports_a_concurrent_mark_as_a_serialization_failure(
    pg: Any, pg2: Any, tag: str
) -> None:
    """Under REPEATABLE READ a mark written after the transaction's snapshot is
    PostgreSQL's serialization failure (retry the transaction), whichever token is newer."""
    fence = PostgresFence(table=f"{tag}_fences")
    async with pg.transaction():
        await fence.advance(pg, 1, resource="r")
    transaction = pg.transaction(isolation="repeatable_read")
    await transaction.start()
    await pg.fetchval("SELECT 1")  # the snapshot
    async with pg2.transaction():
        await PostgresFence(table=f"{tag}_fences").advance(pg2, 5, resource="r")
    with pytest.raises(asyncpg.SerializationError):
        await fence.advance(pg, 9, resource="r")
    await transaction.rollback()


# -- a lease lost without its holder knowing yet ----------------------------------------


@pytest.mark.parametrize("store_kind", ["redis", "postgres"])
async def test_a_lease_lost_unknown_to_its_holder_is_refused_by_the_store(
    request: pytest.FixtureRequest, store_kind: str
) -> None:
    """A's hold expired on the lock server and B wrote, but A's client has not heard yet
    (its next renewal is far off): its lease looks fine, and only the store's mark refuses it."""
    server: RedisServer | PostgresServer = request.getfixturevalue(f"{store_kind}_server")
    store = open_store(store_kind, server.url, f"s{secrets.token_hex(3)}")
    await store.open()
    await store.create()
    prefix = f"m{secrets.token_hex(3)}"
    try:
        async with asynclock.connect("memory://", ttl=scaled(30), prefix=prefix) as a:
            async with asynclock.connect("memory://", ttl=scaled(30), prefix=prefix) as b:
                lease_a = await a.lock(NAME).acquire(detached=True)
                await store.fenced(lease_a, "A-1")
                assert memory.expire(NAME, prefix=prefix)  # gone on the "server"; A's client does not know
                async with b.lock(NAME).acquire(timeout=0) as lease_b:
                    await store.fenced(lease_b, "B-1")
                assert not lease_a.lost
                with pytest.raises(StaleToken) as refused:
                    await store.fenced(lease_a, "A-2")
                assert (refused.value.token, refused.value.mark) == (lease_a.token, lease_b.token)
                assert await store.read() == "B-1"
    finally:
        await store.drop()
        await store.close()


# -- the paused holder ---------------------------------------------------------------------

#: every backend whose leases carry fencing tokens (Redlock's do not)
LOCK_BACKENDS = ["memory", "redis", "redis+cluster", "zookeeper", "etcd", "postgres"]


def _via(url: str, proxy: TcpProxy) -> str:
    host, _, rest = url.partition("127.0.0.1:")
    return f"{host}127.0.0.1:{proxy.port}{rest[rest.index('/') :]}"


@pytest.mark.parametrize("store_kind", ["redis", "postgres"])
@pytest.mark.parametrize("backend", LOCK_BACKENDS)
async def test_a_paused_holder_is_fenced_off_and_its_unfenced_write_overwrites(
    request: pytest.FixtureRequest, backend: str, store_kind: str
) -> None:
    """Holder A stops past its ttl (its process SIGSTOPped; on memory:// its event loop
    blocked), with a fenced write on its way; B takes the lock and writes. The write on
    its way arrives after B's and the store refuses it; A, awake, is refused before any
    I/O (it knows its lease is lost). A plain write, unfenced, silently overwrites B's.

    (The write on its way carries A's bare token: with the lease, the fence's own check
    would also have passed before the pause, but on a machine so loaded that A's
    renewals starve before the pause it would refuse the write itself, and the store's
    refusal would go untested.)"""
    server: RedisServer | PostgresServer = request.getfixturevalue(f"{store_kind}_server")
    url = server.url
    store_prefix = f"s{secrets.token_hex(3)}"
    b_store = open_store(store_kind, url, store_prefix)
    await b_store.open()
    if store_kind == "postgres":
        await b_store.create()
    proxy = TcpProxy("127.0.0.1", server.port).start()  # between A and the store
    holder: HolderProcess | HolderThread | None = None
    try:
        async with make_harness(request, backend) as harness:
            config = Config(harness.url, harness.prefix, TTL, store_kind, _via(url, proxy), store_prefix)
            holder = await (HolderThread if backend == "memory" else HolderProcess).start(config)
            held, token_a = (await holder.ask("acquire")).split()
            assert held == "held"
            assert await holder.ask("write A-1") == "written"  # A holds the lock: its writes go through
            assert await b_store.read() == "A-1"

            assert await holder.ask("prepare") == "prepared"
            proxy.blackhole()
            assert await holder.ask("send A-late") == "sending"  # on its way...
            await asyncio.sleep(scaled(0.1))
            holder.pause()  # ...when A stops, past its ttl

            b = harness.connect(ttl=TTL)
            lease_b = await b.lock(NAME).acquire(timeout=scaled(30))
            assert lease_b.token is not None and lease_b.token > int(token_a)
            await b_store.fenced(lease_b, "B-1")
            assert await b_store.read() == "B-1"

            proxy.heal()  # A's write arrives after B's
            holder.resume()
            assert await holder.ask("outcome") == f"stale {lease_b.token}"  # the store refused it
            assert await b_store.read() == "B-1"
            assert await holder.ask("write A-again") == "stale -"  # known lost: refused before any I/O
            assert await b_store.read() == "B-1"
            assert await b_store.mark() == lease_b.token

            assert await holder.ask("unfenced A-plain") == "written"
            assert await b_store.read() == "A-plain"  # without the fence, B's write is gone

            await lease_b.release()
            await holder.stop()
    finally:
        if holder is not None:
            await holder.stop()
        proxy.stop()
        await b_store.drop()
        await b_store.close()
