"""Redis-only behaviour on real redis-server processes: faults the contract
suite cannot express (server paused, connection cut or reset, restart with
no data, script cache flushed, pub/sub dropped) and the watchdog's batching."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import platform
import random
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.abc import Acquired, LockRef, Queued, RenewItem
from asynclock.backends.redis import RedisBackend
from asynclock.backends.redis._connection import Connection, ms
from asynclock.backends.redis._exclusive import ExclusiveLock
from asynclock.backends.redis._hash import HashLock
from asynclock.backends.redis._listen import Subscribed
from asynclock.backends.redis._private import FORCE_MASTER_IP, PRIVATE, READER, STREAM_BUFFER, WRITER
from asynclock.backends.redis._pubsub import listening_connection
from asynclock.backends.redis._renew import RENEW_CHUNK
from asynclock.backends.redis._shared import QueuedResource
from asynclock.backends.redis.sentinel import _Sentinels
from tests.harnesses import (
    eventually,
    handover_channel,
    has_connection,
    insides,
    listener_port,
    listening,
    redis_backend,
    redis_exclusive,
    redis_listener,
    route,
    routed,
    set_route,
)
from tests.servers import RedisServer, free_port, scaled
from tests.servers.proxy import TcpProxy
from tests.test_primitives import queued

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
async def admin(redis_fresh: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_fresh.url)
    yield client
    await client.aclose()


async def _commands(admin: aioredis.Redis, name: str) -> int:
    stats = await admin.info("commandstats")
    entry = stats.get(f"cmdstat_{name}")
    return int(entry["calls"]) if entry else 0


async def test_server_paused_past_the_ttl_cancels_the_holder_by_its_deadline(redis_fresh: RedisServer) -> None:
    loop = asyncio.get_running_loop()
    async with asynclock.connect(redis_fresh.url, ttl=TTL) as locks:
        cancelled_at: list[float] = []
        with pytest.raises(LockLost):
            async with locks.lock("paused") as lease:
                await asyncio.sleep(TTL / 2)
                redis_fresh.pause()
                try:
                    await asyncio.sleep(60)
                finally:
                    cancelled_at.append(loop.time())
        redis_fresh.resume()
        assert cancelled_at[0] <= lease.expires_at + 0.05, "the body outlived its trusted deadline"
        assert lease.lost


async def test_connection_cut_past_the_ttl_cancels_before_anyone_else_gets_in(redis_fresh: RedisServer) -> None:
    loop = asyncio.get_running_loop()
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        cut = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL)
        direct = asynclock.connect(redis_fresh.url, ttl=TTL)
        async with cut, direct:
            cancelled_at: list[float] = []
            successor_at: list[float] = []
            holding = asyncio.Event()

            async def holder() -> None:
                with pytest.raises(LockLost):
                    async with cut.lock("cut"):
                        proxy.blackhole()
                        holding.set()
                        try:
                            await asyncio.sleep(60)
                        finally:
                            cancelled_at.append(loop.time())

            async def successor() -> None:
                await holding.wait()  # only once the holder holds (and is cut off)
                async with direct.lock("cut"):
                    successor_at.append(loop.time())

            await asyncio.wait_for(asyncio.gather(holder(), successor()), scaled(10))
            proxy.heal()
            assert cancelled_at[0] < successor_at[0], "two holders at once"


async def test_brief_connection_resets_are_not_losses(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        async with asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL) as locks:
            async with locks.lock("resets") as lease:
                for _ in range(4):
                    proxy.reset()
                    await admin.client_kill_filter(_type="normal", skipme=True)
                    await asyncio.sleep(TTL / 2)
                assert not lease.lost


async def test_latency_within_the_ttl_causes_no_loss(redis_fresh: RedisServer) -> None:
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        proxy.delay(0.05)
        async with asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=scaled(1.0)) as locks:
            async with locks.lock("slow") as lease:
                await asyncio.sleep(scaled(2.5))
                assert not lease.lost


async def test_tokens_keep_increasing_after_a_restart_with_no_data(redis_fresh: RedisServer) -> None:
    async with asynclock.connect(redis_fresh.url, ttl=TTL) as locks:
        async with locks.lock("fence") as lease:
            before = lease.token
        assert before is not None
        holder = await locks.lock("held-through-restart").acquire()
        redis_fresh.restart_empty()
        # the hold died with the data: its holder must find out
        assert await asyncio.wait_for(holder.wait_lost(), scaled(5))
        async with locks.lock("fence") as lease:
            assert lease.token is not None and lease.token > before


async def test_script_cache_flush_is_invisible(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    async with asynclock.connect(redis_fresh.url, ttl=TTL) as locks:
        lock = locks.lock("flush")
        for _ in range(3):
            await admin.script_flush()
            async with lock as lease:
                await admin.script_flush()
                await asyncio.sleep(TTL / 2)  # a renewal runs on a flushed cache
                assert not lease.lost
                await admin.script_flush()
                assert (await lock.info()).owner is not None
            await admin.script_flush()


async def test_a_release_wakes_the_waiter_long_before_the_holders_ttl(redis_server: RedisServer) -> None:
    loop = asyncio.get_running_loop()
    ttl = 20.0
    async with (
        asynclock.connect(redis_server.url, ttl=ttl, prefix="wake") as a,
        asynclock.connect(redis_server.url, ttl=ttl, prefix="wake") as b,
    ):
        await a.lock("w").acquire()
        waiter = asyncio.create_task(b.lock("w").acquire())
        await asyncio.sleep(0.1)
        released = loop.time()
        await a.lock("w").release()
        await asyncio.wait_for(waiter, ttl / 2)
        assert loop.time() - released < ttl / 4
        assert waiter.result().token is not None  # held by the finished task; aclose releases it


async def test_a_queued_holds_poll_to_a_silent_server_fails_after_a_ttl(redis_fresh: RedisServer) -> None:
    """A queued hold's poll (the queue client every queueing Redis backend shares) is bounded:
    a server that stops answering fails it with BackendUnavailable after one ttl, naming the
    server, instead of holding the waiter for as long as the connection stays up."""
    ttl = scaled(0.5)
    backend = RedisBackend.from_url(redis_fresh.url)
    ref = LockRef("lock", "silent")
    loop = asyncio.get_running_loop()
    try:
        assert isinstance(await backend.try_acquire(ref, "holder", 60.0, enqueue=False), Acquired)
        assert isinstance(await backend.try_acquire(ref, "waiter", ttl, enqueue=True), Queued)
        redis_fresh.pause()
        started = loop.time()
        try:
            with pytest.raises(
                BackendUnavailable, match=rf"^Redis at 127\.0\.0\.1:\d+ did not answer within {ttl:.3g} s$"
            ):
                await backend.wait_queued(ref, "waiter", ttl, loop.time())  # (due now: it polls at once)
        finally:
            redis_fresh.resume()
        assert ttl <= loop.time() - started < ttl + scaled(1)
    finally:
        await backend.aclose()


async def test_a_hand_over_message_that_arrives_while_a_poll_is_out_is_confirmed_not_trusted(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    """The lock is handed to a waiter whose message is held up; that grant expires
    unrenewed and another client takes the lock; the message arrives while the
    waiter's next poll is out, and the poll answers "still queued". The waiter must
    not take the message's grant as its own: counted from that poll's send time, its
    lease would run while the other client holds the lock. It polls again instead
    (and stays queued), which a grant that is still its own would survive."""
    ttl = scaled(1.0)  # the waiter's: its queue entry outlives the steps up to the hand-over
    name = "stale-hand-over"
    ref = LockRef("lock", name)
    loop = asyncio.get_running_loop()
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl, prefix="sh") as holders,
        asynclock.connect(redis_fresh.url, ttl=ttl, prefix="sh") as waiting,
    ):
        other, waiter = redis_backend(holders), redis_backend(waiting)
        assert isinstance(await other.try_acquire(ref, "first", scaled(30), enqueue=False), Acquired)
        assert isinstance(await waiter.try_acquire(ref, "waiter", ttl, enqueue=True), Queued)
        listener, channel = redis_listener(waiting), handover_channel(waiting)
        async with asyncio.timeout(scaled(5)):  # (its first subscription is confirmed in the background)
            while (await admin.pubsub_numsub(channel))[0][1] < 1:
                await asyncio.sleep(0.01)
        on_message, on_resync = route(listener, channel)
        held: list[bytes] = []
        set_route(listener, channel, held.append, on_resync)  # the waiter's messages are held up
        assert await other.release(ref, "first")  # handed to the waiter
        await eventually(lambda: bool(held), scaled(5), "the hand-over message")
        assert held[0].startswith(b"waiter ")
        set_route(listener, channel, on_message, on_resync)
        await asyncio.sleep(2 * ttl)  # the waiter's grant expires: nobody renews it
        assert isinstance(await other.try_acquire(ref, "second", scaled(30), enqueue=False), Acquired)

        exclusive = redis_exclusive(waiting)
        enter = exclusive.enter

        async def arriving_during_the_poll(*args: Any, **kwargs: Any) -> Any:
            on_message(held[0])  # the held-up message arrives once the poll is sent
            return await enter(*args, **kwargs)

        exclusive.enter = arriving_during_the_poll  # type: ignore[method-assign]
        try:
            first = await waiter.wait_queued(ref, "waiter", ttl, loop.time())  # due now: it polls
        finally:
            del exclusive.enter
        assert isinstance(first, Queued)
        again = await waiter.wait_queued(ref, "waiter", ttl, loop.time() + scaled(5))
        assert isinstance(again, Queued), "the held-up grant was taken for the waiter's own"
        info = await holders.lock(name).info()
        assert info.owner == "second"
        assert await waiter.release(ref, "waiter") is False  # (out of the queue)
        assert await other.release(ref, "second")


async def test_dropped_pubsub_connection_does_not_strand_waiters(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    ttl = 20.0
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl) as a,
        asynclock.connect(redis_fresh.url, ttl=ttl) as b,
    ):
        await a.lock("ps").acquire()
        got = asyncio.Event()

        async def wait_for_it() -> None:
            async with b.lock("ps"):
                got.set()

        waiter = asyncio.create_task(wait_for_it())
        await asyncio.sleep(0.1)
        for _ in range(3):
            async with asyncio.timeout(scaled(5)):
                while not await admin.client_list(_type="pubsub"):
                    await asyncio.sleep(0.01)  # the listener is reconnecting
            assert await admin.client_kill_filter(_type="pubsub") >= 1
        await a.lock("ps").release()  # may be published while b is not subscribed
        await asyncio.wait_for(got.wait(), ttl / 4)
        await waiter


async def test_waiters_survive_a_server_restart(redis_fresh: RedisServer) -> None:
    ttl = 20.0
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl) as a,
        asynclock.connect(redis_fresh.url, ttl=ttl) as b,
    ):
        await a.lock("rs").acquire()
        waiter = asyncio.create_task(b.lock("rs").acquire())
        await asyncio.sleep(0.1)
        redis_fresh.restart_empty()  # the hold is gone; nobody publishes a release
        lease = await asyncio.wait_for(waiter, ttl / 4)
        assert lease.token is not None


async def test_only_one_local_waiter_is_woken_per_release(redis_server: RedisServer) -> None:
    async with asynclock.connect(redis_server.url, ttl=scaled(5), prefix="herd") as locks:
        await insides.start(locks)
        plain = redis_exclusive(locks)  # what answers the plain lock's requests
        requests = 0
        original = plain.enter

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal requests
            requests += 1
            return await original(*args, **kwargs)

        plain.enter = counting  # type: ignore[method-assign]
        workers, rounds = 8, 5

        async def worker() -> None:
            for _ in range(rounds):
                async with locks.lock("h"):
                    await asyncio.sleep(0.002)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), scaled(30))
        acquisitions = workers * rounds
        # each acquisition is one request (it takes the lock, or queues and is
        # handed it); a herd, or waiters polling, would cost more per release
        assert acquisitions <= requests <= acquisitions + workers, (requests, acquisitions)


async def test_watchdog_renews_many_leases_in_few_round_trips(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    ttl = scaled(1.5)
    count = 2000
    async with asynclock.connect(redis_fresh.url, ttl=ttl) as locks:
        leases = [await locks.lock(f"many-{i}").acquire() for i in range(count)]
        keeper = insides.keeper(locks)
        await admin.config_resetstat()
        trips_before = keeper.round_trips
        await asyncio.sleep(ttl)  # three renewal periods
        trips = keeper.round_trips - trips_before
        evals = await _commands(admin, "evalsha") + await _commands(admin, "eval")
        assert all(not lease.lost for lease in leases)
        assert trips <= 15, trips
        assert evals <= 30, evals
        # really renewed, inside the script: each hold's value (with its expiry) is written again
        assert await _commands(admin, "set") >= count
        for i in range(count):
            await locks.lock(f"many-{i}").release()


async def _holds(connection: Connection, count: int, missing: set[int]) -> dict[str, list[RenewItem]]:
    """``count`` holds of the hash lock, the exclusive lock and a semaphore (1 s each), but
    for the indexes ``missing``, whose items name holds never taken; by kind."""
    hashed = HashLock(connection, "chunks-h")
    exclusive = ExclusiveLock(connection, "chunks-x", "chunks-channel")
    shared = QueuedResource(connection, "chunks-s", "chunks-channel")
    items: dict[str, list[RenewItem]] = {"hash": [], "exclusive": [], "semaphore": []}
    for i in range(count):
        lock, permit, hold = LockRef("lock", f"n{i}"), LockRef("semaphore", f"n{i}"), f"hold-{i}"
        if i not in missing:
            # (held long enough that none can expire before the renewal, however slow the machine)
            assert isinstance(await hashed.try_acquire(lock.name, hold, 30.0), Acquired)
            assert (await exclusive.enter(lock, hold, 30.0, enqueue=False, fresh=True)).token is not None
            assert (await shared.enter(permit, hold, 30.0, enqueue=False, fresh=True)).token is not None
        items["hash"].append(RenewItem(lock, hold, 60.0))
        items["exclusive"].append(RenewItem(lock, hold, 60.0))
        items["semaphore"].append(RenewItem(permit, hold, 60.0))
    return items


async def test_a_renewal_past_one_chunk_answers_each_hold_in_its_place(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    """Renewals go out in script calls of RENEW_CHUNK holds: on both sides of the boundary
    each hold gets its own answer (one never taken, in either chunk, is False) and is
    really renewed, for the hash lock, the exclusive lock and a queued resource."""
    count = RENEW_CHUNK + 3
    missing = {5, RENEW_CHUNK + 1}
    client = aioredis.Redis.from_url(redis_fresh.url)
    connection = Connection(client, where="Redis", connect_timeout=5.0, owns_client=True)
    try:
        items = await _holds(connection, count, missing)
        expected = [i not in missing for i in range(count)]
        assert await HashLock(connection, "chunks-h").renew(items["hash"]) == expected
        assert await ExclusiveLock(connection, "chunks-x", "c").renew(items["exclusive"]) == expected
        assert await QueuedResource(connection, "chunks-s", "c").renew(items["semaphore"]) == expected
        for key in ("chunks-h:{n0}", f"chunks-h:{{n{count - 1}}}", "chunks-x:{n0}:x", f"chunks-x:{{n{count - 1}}}:x"):
            assert await admin.pttl(key) > 30_000, key  # taken for 30 s, renewed for 60
        left = await admin.zrange(f"chunks-s:{{n{count - 1}}}:sem", 0, -1, withscores=True)
        [(_, expires_ms)] = left
        [now_s, now_us] = await admin.time()
        assert expires_ms - (now_s * 1000 + now_us // 1000) > 30_000
    finally:
        await connection.aclose()


async def test_a_renewal_answered_readonly_holds_none_of_its_holds(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    """A server that answers READONLY (a replica, or a primary demoted by a failover) holds
    none of the holds it still has: each renewal answers False, not an error to retry."""
    client = aioredis.Redis.from_url(redis_fresh.url)
    connection = Connection(client, where="Redis", connect_timeout=5.0, owns_client=True)
    try:
        items = await _holds(connection, 3, set())
        await admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary that never answers
        assert await admin.exists("chunks-h:{n0}", "chunks-x:{n0}:x") == 2, "the holds are still there"
        assert await HashLock(connection, "chunks-h").renew(items["hash"]) == [False] * 3
        assert await ExclusiveLock(connection, "chunks-x", "c").renew(items["exclusive"]) == [False] * 3
        assert await QueuedResource(connection, "chunks-s", "c").renew(items["semaphore"]) == [False] * 3
    finally:
        await admin.execute_command("REPLICAOF", "NO", "ONE")
        await connection.aclose()


async def test_cancellation_at_random_points_under_latency_leaves_no_key(redis_fresh: RedisServer) -> None:
    rng = random.Random(7)
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        proxy.delay(0.003)
        slow = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=scaled(2.0), prefix="cx")
        fast = asynclock.connect(redis_fresh.url, ttl=scaled(2.0), prefix="cx")
        async with slow, fast:
            lock = slow.lock("c")
            cancelled = 0

            async def use() -> None:
                await lock.acquire()
                await lock.release()

            for _ in range(40):
                task = asyncio.create_task(use())
                await asyncio.sleep(rng.uniform(0, 0.02))
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                # free again well before the 2 s ttl could have freed it
                async with asyncio.timeout(scaled(1.0)), fast.lock("c"):
                    pass
            assert cancelled > 5
        admin = aioredis.Redis.from_url(redis_fresh.url)
        try:
            # what a released lock keeps is its last fencing token, nothing held or queued
            left = [k async for k in admin.scan_iter(match="cx:*") if b" " in (await admin.get(k) or b" ")]
            assert left == []
        finally:
            await admin.aclose()


async def test_given_client_is_used_and_not_closed(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    async with asynclock.connect(client, ttl=TTL, prefix="given") as locks:
        async with locks.lock("g") as lease:
            assert lease.token is not None
            assert b" " in (await client.get("given:{g}:x") or b"")  # held
    assert await client.ping()
    await client.aclose()


async def test_unix_socket_url(redis_server: RedisServer) -> None:
    async with asynclock.connect(redis_server.unix_url, ttl=TTL, prefix="unix") as locks:
        async with locks.lock("u") as lease:
            assert lease.token is not None


async def test_url_query_options(redis_server: RedisServer) -> None:
    async with asynclock.connect(f"{redis_server.url}?ttl=2.5&prefix=q") as locks:
        lock = locks.lock("opt")
        assert lock.ttl == 2.5
        assert lock.key == "q:{opt}:x"
        async with lock:
            assert 0 < ((await lock.info()).ttl or 0) <= 2.5


async def test_unreachable_server_raises_backend_unavailable_within_the_timeout() -> None:
    from tests.servers import free_port

    locks = asynclock.connect(f"redis://127.0.0.1:{free_port()}/0", ttl=TTL)
    with pytest.raises(BackendUnavailable):
        await locks.lock("x").acquire(timeout=0.5)
    await locks.aclose()


async def test_bad_urls_and_objects() -> None:
    with pytest.raises(ValueError, match="scheme"):
        asynclock.connect("mssql://localhost/db")
    with pytest.raises(ValueError):
        asynclock.connect("nothing-here")
    with pytest.raises(TypeError):
        asynclock.connect(object())
    with pytest.raises(ValueError):
        asynclock.connect("redis://localhost:6379/0?ttl=-3")
    with pytest.raises(ValueError):
        asynclock.connect("memory://", prefix="")


def test_pexpire_argument_is_never_zero_or_negative() -> None:
    assert ms(1e-9) == 1
    assert ms(0.0015) == 2
    assert ms(30.0) == 30000


def _resolve(dotted: str) -> Any:
    """The module, class or attribute named by a dotted path."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


async def test_every_private_name_the_redis_backends_read_is_still_there(redis_server: RedisServer) -> None:
    """Each entry of ``_private.PRIVATE`` exists in the installed redis-py and asyncio, on
    the objects the code reads it from: a connection made as the pub/sub listener makes
    its own, connected to a real server, and its stream reader. A release that moves one
    fails here, naming the attribute, the file that reads it and the library's version."""
    pool = aioredis.ConnectionPool.from_url(redis_server.url)
    conn = listening_connection(pool.connection_class, pool.connection_kwargs)
    await conn.connect()
    try:
        # the objects that instance attributes are read from (a class attribute is read from its owner)
        instances: dict[str, Any] = {
            "redis.asyncio.connection.AbstractConnection": conn,
            "asyncio.StreamReader": getattr(conn, READER, None),
            "redis.asyncio.sentinel.Sentinel": _Sentinels([("127.0.0.1", 1)], force_master_ip="192.0.2.1"),
            "redis.asyncio.cluster.RedisCluster": RedisCluster(host="127.0.0.1", port=1),  # not connected
        }
        gone: list[str] = []
        for entry in PRIVATE:
            owner = _resolve(entry.owner)
            where = instances.get(entry.owner, owner)
            version = platform.python_version() if entry.library == "python" else metadata.version(entry.library)
            if where is None or (where is not owner and not isinstance(where, owner)):
                gone.append(f"{entry.owner}: nothing to read {entry.attribute!r} from ({entry.library} {version})")
            elif not hasattr(where, entry.attribute):
                gone.append(
                    f"{entry.owner}.{entry.attribute}, read in asynclock/backends/{entry.used_in},"
                    f" is gone in {entry.library} {version}"
                )
        assert not gone, "private names moved:\n" + "\n".join(gone)
        # and they hold what the code takes them for
        reader, writer = getattr(conn, READER), getattr(conn, WRITER)
        assert isinstance(reader, asyncio.StreamReader) and isinstance(writer, asyncio.StreamWriter)
        assert isinstance(getattr(reader, STREAM_BUFFER), bytearray)
        assert getattr(instances["redis.asyncio.sentinel.Sentinel"], FORCE_MASTER_IP) == "192.0.2.1"
    finally:
        await conn.disconnect()
        await pool.aclose()


async def test_the_edge_masks_a_secret_added_after_the_connection_was_made() -> None:
    """The connection's error edge translates redis-py's errors (the original as the cause),
    masking a password added later too (Sentinel adds the sentinels')."""
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # (no I/O here)
    connection = Connection(client, where="Redis at here", connect_timeout=1.0, secrets=["first-Pa55"])
    connection.add_secret("later-Pa55")
    original = redis_errors.ResponseError("refused first-Pa55 and later-Pa55")
    with pytest.raises(asynclock.LockError) as caught:
        with connection.edge:
            raise original
    assert caught.value.__cause__ is original
    assert str(caught.value) == "Redis at here: Redis error: refused *** and ***", str(caught.value)
    with pytest.raises(BackendUnavailable, match=r"^Redis at here could not be reached: connection refused$"):
        async with connection.edge:
            raise redis_errors.ConnectionError("Error connecting to 127.0.0.1:1") from ConnectionRefusedError()
    await client.aclose()


async def test_timeout_while_busy_is_lock_timeout_not_unavailable(redis_server: RedisServer) -> None:
    async with (
        asynclock.connect(redis_server.url, ttl=TTL, prefix="tb") as a,
        asynclock.connect(redis_server.url, ttl=TTL, prefix="tb") as b,
    ):
        async with a.lock("t"):
            with pytest.raises(LockTimeout):
                await b.lock("t").acquire(timeout=0.2)


def test_backend_keys_share_one_hash_tag() -> None:
    backend = RedisBackend(aioredis.Redis(), prefix="p")
    assert backend.lock_key(LockRef("lock", "n")) == backend.lock_key(LockRef("fair", "n")) == "p:{n}:x"
    assert backend.lock_key(LockRef("write", "n")) == "p:{n}:rw"
    assert backend.lock_key(LockRef("semaphore", "n", 3)) == "p:{n}:sem"
    # the hash lock of Cluster and Redlock: the hash and its release channel
    hashed = HashLock(backend.connection, "p")
    assert hashed.key("n") == "p:{n}"
    assert hashed.channel("n") == "p:{n}:released"


async def test_tls_url() -> None:
    server = RedisServer(tls=True)
    server.start()
    try:
        async with asynclock.connect(server.tls_url, ttl=TTL) as locks:
            async with locks.lock("tls") as lease:
                assert lease.token is not None
                await asyncio.sleep(TTL / 2)  # a renewal over TLS
                assert not lease.lost
        # the pub/sub listener connects over TLS too: a release wakes the waiter
        async with (
            asynclock.connect(server.tls_url, ttl=20) as a,
            asynclock.connect(server.tls_url, ttl=20) as b,
        ):
            await a.lock("w").acquire()
            waiter = asyncio.create_task(b.lock("w").acquire())
            await asyncio.sleep(0.1)
            await a.lock("w").release()
            await asyncio.wait_for(waiter, 5)
    finally:
        server.cleanup()


# -- the plain lock is the fair lock ------------------------------------------------


async def test_the_plain_and_the_fair_lock_of_a_name_are_one_lock(redis_server: RedisServer) -> None:
    """On one server the plain lock is FIFO and handed over in the release: it
    is the fair lock of its name (one key, one hold per task, one queue)."""
    async with (
        asynclock.connect(redis_server.url, ttl=TTL, prefix="one") as a,
        asynclock.connect(redis_server.url, ttl=TTL, prefix="one") as b,
    ):
        plain, fair = a.lock("x"), a.lock("x", fair=True)
        assert plain.key == fair.key == "one:{x}:x"
        lease = await plain.acquire()
        assert await fair.acquire() is lease  # the same task re-enters, whichever handle
        with pytest.raises(LockTimeout):
            await b.lock("x", fair=True).acquire(timeout=0)
        with pytest.raises(LockTimeout):
            await b.lock("x").acquire(timeout=0)
        await fair.release()
        await plain.release()
        # waiters of either handle are served in the order they queued
        await plain.acquire()
        order: list[str] = []

        async def wait(lock: asynclock.Lock, tag: str) -> None:
            async with lock:
                order.append(tag)

        first = asyncio.create_task(wait(b.lock("x"), "plain"))
        await queued(plain, 1)
        second = asyncio.create_task(wait(b.lock("x", fair=True), "fair"))
        await queued(plain, 2)
        await plain.release()
        await asyncio.wait_for(asyncio.gather(first, second), scaled(10))
        assert order == ["plain", "fair"]


async def test_a_release_hands_over_without_another_request_from_the_waiter(redis_fresh: RedisServer) -> None:
    """The next holder's acquire returns on the hand-over message alone: its
    client sends nothing between the release and holding the lock."""
    async with (
        asynclock.connect(redis_fresh.url, ttl=TTL, prefix="hand") as holder,
        asynclock.connect(redis_fresh.url, ttl=TTL, prefix="hand") as waiter,
    ):
        lock = holder.lock("h")
        await lock.acquire()
        got, done = asyncio.Event(), asyncio.Event()

        async def hold() -> asynclock.Lease:
            async with waiter.lock("h") as lease:
                got.set()
                await done.wait()
            return lease

        waiting = asyncio.create_task(hold())
        await queued(lock, 1)
        sent: list[object] = []
        connection_class: Any = redis_backend(waiter).client.connection_pool.connection_class
        real = connection_class.send_packed_command

        async def counted(self: Any, command: Any, check_health: bool = True) -> None:
            packed = b"".join(command) if isinstance(command, list) else bytes(command)
            if waiter.client_id.encode() in packed:  # a request about one of the waiter's holds
                sent.append(packed)
            await real(self, command, check_health)

        connection_class.send_packed_command = counted
        try:
            await lock.release()
            await asyncio.wait_for(got.wait(), scaled(5))
            assert sent == [], f"the waiter's client sent {len(sent)} request(s) to take a lock handed to it"
            done.set()
            lease = await asyncio.wait_for(waiting, scaled(5))
            # (the count does see the waiter's requests: its release is one)
            assert len(sent) == 1, sent
        finally:
            connection_class.send_packed_command = real
        assert not lease.lost and lease.token is not None


# -- a pub/sub connection that dies without a word ---------------------------------


async def test_a_silently_dead_pubsub_connection_is_replaced_and_hand_overs_arrive_by_message_again(
    redis_fresh: RedisServer,
) -> None:
    """The waiter's pub/sub connection is black-holed (no FIN: a dropped NAT
    entry, a paused proxy). Its health check notices within ttl/3 and the
    listener connects again; the next hand-over then reaches the waiter as a
    message, not by its own poll (which would come a third of a ttl later)."""
    loop = asyncio.get_running_loop()
    ttl = scaled(3.0)
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        async with (
            asynclock.connect(redis_fresh.url, ttl=ttl, prefix="bh") as holder,
            asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=ttl, prefix="bh") as waiter,
        ):
            lock = holder.lock("h")
            await lock.acquire()
            got = asyncio.Event()

            async def hold() -> None:
                async with waiter.lock("h"):
                    got.set()

            waiting = asyncio.create_task(hold())
            await queued(lock, 1)
            listener = redis_listener(waiter)
            assert has_connection(listener)
            channel = handover_channel(waiter)
            arrived: list[bytes] = []  # hand-over messages that reach the waiter's client
            on_message, on_resync = route(listener, channel)

            def record(payload: bytes) -> None:
                arrived.append(payload)
                on_message(payload)

            set_route(listener, channel, record, on_resync)
            before = listener.reconnects
            proxy.blackhole_client(listener_port(listener))
            silenced = loop.time()
            await eventually(lambda: listener.reconnects > before, ttl, "the listener to notice the dead connection")
            assert loop.time() - silenced <= ttl / 3 + scaled(0.5)
            await eventually(lambda: listening(listener), scaled(5), "the listener to connect again")
            await lock.release()
            released = loop.time()
            await eventually(lambda: bool(arrived), ttl / 4, "the hand-over message to arrive")
            await asyncio.wait_for(got.wait(), scaled(5))
            assert loop.time() - released < ttl / 4  # well before a poll a third of a ttl later
            await asyncio.wait_for(waiting, scaled(5))


async def test_the_subscribed_reader_hands_over_each_reply_as_its_last_byte_arrives() -> None:
    """Replies cut anywhere (as TCP may deliver them) reach the listener whole and in
    order, each within the call that delivered its last byte (no task or loop turn in
    between); an error reply, or bytes that are not RESP, end the connection."""
    stream = (
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$10\r\nhold 12345\r\n"
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$-1\r\n"
    )
    expected = [[b"subscribe", b"ch", 1], [b"message", b"ch", b"hold 12345"], [b"pong", b""], [b"message", b"ch", None]]
    ends = [stream.index(b"*", 1), stream.index(b"*2"), stream.rindex(b"*3"), len(stream)]
    for cut in (1, 2, 3, 7, len(stream)):
        got: list[Any] = []
        reader = Subscribed(got.append)
        for start in range(0, len(stream), cut):
            reader.data_received(stream[start : start + cut])
            whole = sum(end <= start + cut for end in ends)
            assert got == expected[:whole], (cut, start)
        assert reader.replies == len(expected)
    for garbage, error in (
        (b"-NOPERM this user has no permissions to access the 'ch' channel\r\n", redis_errors.NoPermissionError),
        (b"?what\r\n", redis_errors.InvalidResponse),
        (b"*1\r\n$x\r\n", redis_errors.InvalidResponse),
    ):
        got = []
        reader = Subscribed(got.append)
        reader.data_received(garbage)
        reader.data_received(stream)  # nothing is read after the end
        with pytest.raises(error):
            await asyncio.wait_for(reader.watch(lambda: 10.0), 1)
        assert got == []


# -- elections: the exclusive lock's line, with its changes on a channel of its own ---------------


async def test_an_election_is_a_lock_of_its_own_whose_holder_carries_the_identity(
    redis_server: RedisServer,
) -> None:
    """``<prefix>:{name}:e`` holds the leader's hold with its identity; the scripts publish
    on the channel of that name at each change of leader (a take, a hand-over, a release
    with nobody in line), never for a renewal; an election is not listed among the locks."""
    ttl = scaled(3.0)
    admin = aioredis.Redis.from_url(redis_server.url)
    listener = admin.pubsub()
    async with (
        asynclock.connect(redis_server.url, ttl=ttl, prefix="el") as a,
        asynclock.connect(redis_server.url, ttl=ttl, prefix="el") as b,
    ):
        election = a.election("sched", identity="replica 7 ✓")
        assert election.key == "el:{sched}:e"
        await listener.subscribe(election.key)
        assert (await listener.get_message(timeout=scaled(5)))["type"] == "subscribe"  # type: ignore[index]
        async with election.leadership() as first:
            value = (await admin.get(election.key)).decode()
            assert value.endswith("/replica%207%20%E2%9C%93")
            assert value.startswith(f"{first.token} 1 ")
            assert await redis_backend(a).names() == []
            taking = asyncio.create_task(_lead(b.election("sched", identity="b")))
            async with asyncio.timeout(scaled(5)):
                while (await election.info()).waiters != 1:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(ttl / 2)  # (renewals, which publish nothing)
            await election.resign()
        second = await asyncio.wait_for(taking, scaled(5))
        messages = []
        async with asyncio.timeout(scaled(5)):
            while len(messages) < 3:
                message = await listener.get_message(timeout=scaled(5))
                if message is not None:
                    messages.append(message["data"].decode())
        assert messages[0].startswith(f"{first.token} 1 ") and messages[0].endswith("/replica%207%20%E2%9C%93")
        assert messages[1].startswith(f"{second} 1 ") and messages[1].endswith("/b")
        assert messages[2] == str(second)  # released, nobody in line: free, with its last token
        assert await listener.get_message(timeout=0.1) is None
    await listener.aclose()
    await admin.aclose()


async def _lead(election: asynclock.Election) -> int | None:
    async with election.leadership() as term:
        return term.token


@contextlib.asynccontextmanager
async def _observing(
    url: str, *, ttl: float
) -> AsyncIterator[tuple[asynclock.Locks, asynclock.Locks, AsyncIterator[asynclock.Leader | None]]]:
    """A candidate's client, an observer's client, and the observer's changes of election "e"
    (its first answer, nobody leads, already read)."""
    async with asynclock.connect(url, ttl=ttl) as a, asynclock.connect(url, ttl=ttl) as watcher:
        changes = watcher.election("e").observe()
        assert await anext(changes) is None
        yield a, watcher, changes


async def test_an_observer_reads_again_after_its_pubsub_connection_is_made_again(redis_fresh: RedisServer) -> None:
    """A change of leader whose message the observer's client did not get (published while
    its pub/sub connection was down) is seen once that connection is back: the observer
    reads again after the resubscription, not a ttl later when the leader's hold expires."""
    async with _observing(redis_fresh.url, ttl=30.0) as (a, watcher, changes):
        election = a.election("e", identity="a")
        async with election.leadership() as term:
            seen = await asyncio.wait_for(anext(changes), scaled(5))
            assert seen == asynclock.Leader("a", term.token, None)
            listener = redis_listener(watcher)
            channel = election.key.encode()
            on_message, on_resync = route(listener, channel)
            missed: list[bytes] = []
            set_route(listener, channel, missed.append, on_resync)  # as if published while it reconnected
        async with asyncio.timeout(scaled(5)):
            while not missed:
                await asyncio.sleep(0.01)
        set_route(listener, channel, on_message, on_resync)
        looking = asyncio.create_task(anext(changes))
        await asyncio.sleep(scaled(0.2))
        assert not looking.done(), "the observer did not hear of the resign"
        before = listener.reconnects
        assert await _kill_pubsub(redis_fresh) >= 1
        assert await asyncio.wait_for(looking, scaled(5)) is None
        assert listener.reconnects > before
        await changes.aclose()  # type: ignore[attr-defined]
        assert not routed(listener, channel), "the last observer gone, its election's messages are dropped"


async def test_an_observer_of_a_server_that_goes_silent_ends_unavailable(redis_fresh: RedisServer) -> None:
    """The leader's hold expires while the server is paused: the observer's read at that moment
    gets no answer, and the iteration ends with BackendUnavailable within about a ttl, not never."""
    ttl = 1.0
    async with _observing(redis_fresh.url, ttl=ttl) as (a, _watcher, changes):
        with pytest.raises(asynclock.LockLost):
            async with a.election("e", identity="a").leadership() as term:
                assert await asyncio.wait_for(anext(changes), scaled(5)) == asynclock.Leader("a", term.token, None)
                looking = asyncio.create_task(anext(changes))  # reads again when the leader's hold would expire
                redis_fresh.pause()
                try:
                    with pytest.raises(asynclock.BackendUnavailable):
                        await asyncio.wait_for(looking, scaled(8))
                finally:
                    redis_fresh.resume()
                await asyncio.sleep(scaled(5))  # (the body runs on until the silent server costs it the lease)
        await changes.aclose()  # type: ignore[attr-defined]


async def _kill_pubsub(server: RedisServer) -> int:
    admin = aioredis.Redis.from_url(server.url)
    try:
        return int(await admin.client_kill_filter(_type="pubsub"))
    finally:
        await admin.aclose()


async def test_a_client_renews_its_terms_locks_and_permits_together(redis_server: RedisServer) -> None:
    """One renewal round carries holds of every kind: each kind's keys are renewed by its own
    script, a candidate's hold as the scripts know it (with its identity): none is lost."""
    async with asynclock.connect(redis_server.url, ttl=TTL, prefix="mix") as locks:
        async with (
            locks.election("m", identity="x").leadership() as term,
            locks.lock("m") as lease,
            locks.semaphore("m", permits=2) as permit,
        ):
            await asyncio.sleep(3 * TTL)
            assert not (term.lost or lease.lost or permit.lost)
            assert await locks.election("m").leader() == asynclock.Leader("x", term.token, None)
