"""Redis-only behaviour on real redis-server processes: faults the contract
suite cannot express (server paused, connection cut or reset, restart with
no data, script cache flushed, pub/sub dropped) and the watchdog's batching."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.abc import Acquired, Busy
from asynclock.backends.redis import RedisBackend, _ms
from tests.harness import redis_backend
from tests.servers import RedisServer, scaled
from tests.servers.proxy import TcpProxy

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
        backend = redis_backend(locks)
        tries = 0
        original = backend.try_acquire

        async def counting(name: str, hold: str, ttl: float) -> Acquired | Busy:
            nonlocal tries
            tries += 1
            return await original(name, hold, ttl)

        backend.try_acquire = counting  # type: ignore[method-assign]
        workers, rounds = 8, 5

        async def worker() -> None:
            for _ in range(rounds):
                async with locks.lock("h"):
                    await asyncio.sleep(0.002)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), scaled(30))
        acquisitions = workers * rounds
        # each acquisition costs about one try after its wake-up, plus the
        # fast-path try and the try after subscribing; a herd would cost
        # about `workers` tries per release
        assert tries <= acquisitions * 3 + workers, (tries, acquisitions)


async def test_watchdog_renews_many_leases_in_few_round_trips(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    ttl = scaled(1.5)
    count = 2000
    async with asynclock.connect(redis_fresh.url, ttl=ttl) as locks:
        leases = [await locks.lock(f"many-{i}").acquire() for i in range(count)]
        assert locks._keeper is not None
        await admin.config_resetstat()
        trips_before = locks._keeper.round_trips
        await asyncio.sleep(ttl)  # three renewal periods
        trips = locks._keeper.round_trips - trips_before
        evals = await _commands(admin, "evalsha") + await _commands(admin, "eval")
        assert all(not lease.lost for lease in leases)
        assert trips <= 15, trips
        assert evals <= 30, evals
        assert await _commands(admin, "pexpire") >= count  # really renewed, inside the script
        for i in range(count):
            await locks.lock(f"many-{i}").release()


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
            left = [k async for k in admin.scan_iter(match="cx:*") if not k.endswith(b":fence")]
            assert left == []
        finally:
            await admin.aclose()


async def test_given_client_is_used_and_not_closed(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    async with asynclock.connect(client, ttl=TTL, prefix="given") as locks:
        async with locks.lock("g") as lease:
            assert lease.token is not None
            assert await client.exists("given:{g}") == 1
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
        assert lock.key == "q:{opt}"
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
        asynclock.connect("mysql://localhost/db")
    with pytest.raises(ValueError):
        asynclock.connect("nothing-here")
    with pytest.raises(TypeError):
        asynclock.connect(object())
    with pytest.raises(ValueError):
        asynclock.connect("redis://localhost:6379/0?ttl=-3")
    with pytest.raises(ValueError):
        asynclock.connect("memory://", prefix="")


def test_pexpire_argument_is_never_zero_or_negative() -> None:
    assert _ms(1e-9) == 1
    assert _ms(0.0015) == 2
    assert _ms(30.0) == 30000


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
    assert backend.lock_key("n") == "p:{n}"
    assert backend.channel("n") == "p:{n}:released"


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


# -- one release wakes one client ---------------------------------------------------


def _count_tries(locks: asynclock.Locks) -> list[int]:
    """Count the tries of ``locks``' backend (a one-element list, reset by assigning [0])."""
    backend = redis_backend(locks)
    tries = [0]
    original = backend.try_acquire

    async def counting(name: str, hold: str, ttl: float) -> Acquired | Busy:
        tries[0] += 1
        return await original(name, hold, ttl)

    backend.try_acquire = counting  # type: ignore[method-assign]
    return tries


async def _wait_until(predicate: object, what: str) -> None:
    async with asyncio.timeout(scaled(10)):
        while not await predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_one_release_costs_one_try_across_clients(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    """Waiters in four clients (two each): each release wakes exactly one of them, and all get in."""
    ttl = 20.0  # nobody retries on the holder's lease running out
    clients = [asynclock.connect(redis_fresh.url, ttl=ttl, prefix="one") for _ in range(5)]
    for locks in clients:
        await locks.__aenter__()
    try:
        holder, waiters = clients[0], clients[1:]
        await holder.lock("x").acquire()
        counters = [_count_tries(locks) for locks in waiters]
        got: asyncio.Queue[int] = asyncio.Queue()
        go_on = [asyncio.Event() for _ in range(8)]

        async def wait_for_it(index: int) -> None:
            lock = waiters[index // 2].lock("x")
            async with lock:
                await got.put(index)
                await go_on[index].wait()

        tasks = [asyncio.create_task(wait_for_it(i)) for i in range(8)]
        key = redis_backend(holder).waiting_key("x")

        async def all_registered() -> bool:
            hubs_full = all(locks._hub is not None and locks._hub.waiting("x") == 2 for locks in waiters)
            return hubs_full and await admin.zcard(key) == len(waiters)

        await _wait_until(all_registered, "every client registered")
        await asyncio.sleep(scaled(0.3))  # the second waiters' own tries settle
        for counter in counters:
            counter[0] = 0
        await holder.lock("x").release()
        order = []
        for _ in range(8):
            index = await asyncio.wait_for(got.get(), ttl / 4)
            order.append(index)
            await asyncio.sleep(scaled(0.05))  # room for any spurious try to show
            assert sum(counter[0] for counter in counters) == len(order), (order, [c[0] for c in counters])
            go_on[index].set()  # its release wakes the next client
        await asyncio.gather(*tasks)
        assert sorted(order) == list(range(8))
        assert not await admin.exists(key)  # every entry was used up or taken back
    finally:
        for locks in clients:
            await locks.__aexit__(None, None, None)


async def test_a_client_whose_waiters_left_passes_the_wake_up_on(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    ttl = 20.0
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl) as holder,
        asynclock.connect(redis_fresh.url, ttl=ttl) as idle,
        asynclock.connect(redis_fresh.url, ttl=ttl) as waiting,
    ):
        idle_backend = redis_backend(idle)
        await idle.lock("warm").acquire()  # starts the backend
        await idle.lock("warm").release()
        # ``idle`` listens on its wake-up channel (as after any wait) ...
        await idle_backend.subscribe("other")
        await idle_backend.unsubscribe("other")
        channel = idle_backend.wake_channel
        await _wait_until(lambda: _equals(admin.pubsub_numsub(channel), [(channel.encode(), 1)]), "listening")
        await holder.lock("p").acquire()
        waiter = asyncio.create_task(waiting.lock("p").acquire())
        key = redis_backend(holder).waiting_key("p")
        await _wait_until(lambda: admin.zcard(key), "the waiter registered")
        # ... and stands first in line for "p", with no waiter of its own (they left).
        score = await _first_score(admin, key)
        await admin.zadd(key, {channel: score - 1})
        await holder.lock("p").release()
        await asyncio.wait_for(waiter, ttl / 4)  # long before the 20 s lease: the wake-up was passed on
        assert await admin.zscore(key, channel) is None


async def test_a_registered_client_that_is_gone_is_skipped(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    ttl = 20.0
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl) as holder,
        asynclock.connect(redis_fresh.url, ttl=ttl) as waiting,
    ):
        await holder.lock("g").acquire()
        waiter = asyncio.create_task(waiting.lock("g").acquire())
        key = redis_backend(holder).waiting_key("g")
        await _wait_until(lambda: admin.zcard(key), "the waiter registered")
        score = await _first_score(admin, key)
        # first in line: a client that died (nobody listens on its channel), and a stale entry
        await admin.zadd(key, {"asynclock:wake:gone": score - 1, "asynclock:wake:stale": 1})
        await holder.lock("g").release()
        await asyncio.wait_for(waiter, ttl / 4)
        assert await admin.zcard(key) == 0


async def test_a_try_lock_does_not_register(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    async with (
        asynclock.connect(redis_fresh.url, ttl=TTL) as holder,
        asynclock.connect(redis_fresh.url, ttl=TTL) as other,
    ):
        await holder.lock("t").acquire()
        with pytest.raises(LockTimeout):
            await other.lock("t").acquire(timeout=0)
        assert not await admin.exists(redis_backend(holder).waiting_key("t"))
        await holder.lock("t").release()


async def test_a_waiter_that_times_out_takes_its_entry_back(redis_fresh: RedisServer, admin: aioredis.Redis) -> None:
    async with (
        asynclock.connect(redis_fresh.url, ttl=scaled(5)) as holder,
        asynclock.connect(redis_fresh.url, ttl=scaled(5)) as other,
    ):
        await holder.lock("o").acquire()
        key = redis_backend(holder).waiting_key("o")
        with pytest.raises(LockTimeout):
            await other.lock("o").acquire(timeout=scaled(0.3))
        await _wait_until(lambda: _not(admin.exists(key)), "the entry was taken back")
        await holder.lock("o").release()


async def _not(awaitable: Any) -> bool:
    return not await awaitable


async def test_no_wake_up_is_lost_when_pubsub_drops_in_the_middle(
    redis_fresh: RedisServer, admin: aioredis.Redis
) -> None:
    """Registered waiters in three clients; their listeners are cut, and a release goes by meanwhile."""
    ttl = 20.0
    clients = [asynclock.connect(redis_fresh.url, ttl=ttl) for _ in range(4)]
    for locks in clients:
        await locks.__aenter__()
    try:
        holder, waiters = clients[0], clients[1:]
        await holder.lock("d").acquire()
        got: asyncio.Queue[int] = asyncio.Queue()
        go_on = [asyncio.Event() for _ in waiters]

        async def wait_for_it(index: int) -> None:
            async with waiters[index].lock("d"):
                await got.put(index)
                await go_on[index].wait()

        tasks = [asyncio.create_task(wait_for_it(i)) for i in range(len(waiters))]
        key = redis_backend(holder).waiting_key("d")
        await _wait_until(lambda: _equals(admin.zcard(key), len(waiters)), "every client registered")
        assert await admin.client_kill_filter(_type="pubsub") >= len(waiters)
        await holder.lock("d").release()  # may reach nobody: then the entries are dropped
        for _ in waiters:  # everyone still gets in, long before the 20 s lease
            index = await asyncio.wait_for(got.get(), ttl / 4)
            go_on[index].set()
        await asyncio.gather(*tasks)
    finally:
        for locks in clients:
            await locks.__aexit__(None, None, None)


async def _first_score(admin: aioredis.Redis, key: str) -> float:
    entries: Any = await admin.zrange(key, 0, 0, withscores=True)
    return float(entries[0][1])


async def _equals(awaitable: Any, value: object) -> bool:
    return bool(await awaitable == value)


async def test_the_releaser_does_not_take_the_lock_back_from_the_client_it_woke(redis_fresh: RedisServer) -> None:
    ttl = 20.0
    async with (
        asynclock.connect(redis_fresh.url, ttl=ttl) as a,
        asynclock.connect(redis_fresh.url, ttl=ttl) as b,
    ):
        await a.lock("turn").acquire()
        waiter = asyncio.create_task(b.lock("turn").acquire())
        await _wait_until(lambda: _registered(b, "turn"), "b registered")
        b_backend = redis_backend(b)
        listener = b_backend._listener
        assert listener is not None
        channel = b_backend.wake_channel.encode()
        deliver, resync = listener._routes[channel]
        loop = asyncio.get_running_loop()
        # b hears of the release a little late (as a busy process would) ...

        def late(payload: bytes) -> None:
            loop.call_later(0.05, deliver, payload)

        listener._routes[channel] = (late, resync)
        await a.lock("turn").release()
        # ... and meanwhile a try of the releaser's client is refused: it is b's turn
        answer = await redis_backend(a).try_acquire("turn", f"{a.client_id}:raw", ttl)
        assert isinstance(answer, Busy), answer
        lease = await asyncio.wait_for(waiter, ttl / 4)
        assert lease.token is not None
        info = await b.lock("turn").info()
        assert info.owner is not None and info.owner.startswith(b.client_id)


async def _registered(locks: asynclock.Locks, name: str) -> bool:
    backend = redis_backend(locks)
    return await backend.client.zscore(backend.waiting_key(name), backend.wake_channel) is not None
