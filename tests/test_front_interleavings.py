"""Interleavings of the front (engine, watchdog, wake-ups, close), run per backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.backends import memory
from tests.faults import hygiene
from tests.harnesses import Harness, insides
from tests.servers import RedisServer, scaled
from tests.servers.proxy import TcpProxy
from tests.test_primitives import queued

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
async def admin_fresh(redis_fresh: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_fresh.url)
    yield client
    await client.aclose()


async def test_aclose_cancels_a_running_body_before_it_releases(harness: Harness) -> None:
    """Closing a client while an ``async with`` body runs under one of its
    leases: the body is cancelled (and gets LockLost) before another client
    can take the lock, not left running while the server lets a successor in."""
    closing = harness.connect(ttl=10 * TTL)
    other = harness.connect(ttl=TTL)
    order: list[str] = []
    entered = asyncio.Event()

    async def holder() -> None:
        try:
            async with closing.lock("closed-under-body"):
                entered.set()
                try:
                    await asyncio.sleep(30 * TTL)
                except asyncio.CancelledError:
                    order.append("body cancelled")
                    raise
        except LockLost:
            order.append("LockLost")

    task = asyncio.create_task(holder())
    try:
        await asyncio.wait_for(entered.wait(), 10 * TTL)
        await closing.aclose()
        lease = await other.lock("closed-under-body").acquire(timeout=20 * TTL)
        order.append("successor acquired")
        assert lease.token is not None or not getattr(harness, "has_tokens", True)
        await other.lock("closed-under-body").release()
        assert order[:1] == ["body cancelled"], order
        await asyncio.wait_for(task, 10 * TTL)
        assert order == ["body cancelled", "LockLost", "successor acquired"], order
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_aclose_ends_a_waiting_acquire_without_a_hold(harness: Harness) -> None:
    """An acquire waiting in another task when its client is closed ends with
    an error; it never gets the lock afterwards (with nobody left to release it,
    and a fresh watchdog renewing it for ever)."""
    holder = harness.connect(ttl=TTL)
    closing = harness.connect(ttl=TTL)
    lock = holder.lock("closed-while-waiting")
    await lock.acquire()
    waiting = asyncio.create_task(closing.lock("closed-while-waiting").acquire())
    try:
        await asyncio.sleep(TTL / 3)  # the waiter tried once and waits now
        assert not waiting.done()
        await closing.aclose()
        await lock.release()
        with pytest.raises(BackendUnavailable, match="closed"):
            await asyncio.wait_for(waiting, 10 * TTL)
        info = await holder.lock("closed-while-waiting").info()
        assert info.owner is None or not info.owner.startswith(closing.client_id), info
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_a_subscribe_into_a_black_hole_does_not_outlast_the_acquire_timeout(redis_fresh: RedisServer) -> None:
    """The pub/sub connection is up but stops answering (a silently dropped
    idle connection): an acquire with a timeout still ends, it does not wait
    for ever for the SUBSCRIBE confirmation."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL)
        direct = asynclock.connect(redis_fresh.url, ttl=30 * TTL)
        async with via, direct:
            first = direct.lock("warm")
            await first.acquire()

            async def wait_then_release() -> None:
                async with via.lock("warm"):
                    pass

            warm = asyncio.create_task(wait_then_release())
            await queued(direct.lock("warm"), 1)
            await first.release()  # the listener is connected and delivers this release
            await asyncio.wait_for(warm, scaled(5))

            await direct.lock("stalled").acquire()
            proxy.blackhole()
            try:
                with pytest.raises((BackendUnavailable, LockTimeout)):
                    await asyncio.wait_for(via.lock("stalled").acquire(timeout=TTL), scaled(20))
            finally:
                proxy.heal()
            await direct.lock("stalled").release()


async def test_a_try_answered_lost_at_the_deadline_gives_the_lock_back(
    redis_fresh: RedisServer, admin_fresh: aioredis.Redis
) -> None:
    """The last try of a timed-out acquire reaches the server (and takes the
    lock) but its answer is lost: the acquire raises LockTimeout, and the hold
    it may have got is given back by its identity, not left held for a whole
    ttl with nobody to renew or release it."""
    long_ttl = scaled(60)
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=long_ttl)
        direct = asynclock.connect(redis_fresh.url, ttl=long_ttl)
        async with via, direct:
            holder = direct.lock("lost-answer")
            await holder.acquire()
            waiting = asyncio.create_task(via.lock("lost-answer").acquire(timeout=0.5))
            try:
                await queued(direct.lock("lost-answer"), 1)
                proxy.delay(0.3)  # each way: the answer comes >= 0.6 s after the release, past the deadline
                await holder.release()

                async def owner() -> str:  # the plain lock's holder (the last field of its value)
                    value = await admin_fresh.get("asynclock:{lost-answer}:x") or b""
                    return value.decode().rpartition(" ")[2] if b" " in value else ""

                loop = asyncio.get_running_loop()
                give_up = loop.time() + scaled(10)
                while not (await owner()).startswith(via.client_id):
                    assert loop.time() < give_up and not waiting.done(), "the try never reached the server"
                    await asyncio.sleep(0.005)
                proxy.refuse()
                proxy.reset()  # the answer, still in the proxy, is lost; reconnects are refused
                with pytest.raises((LockTimeout, BackendUnavailable)):
                    await asyncio.wait_for(waiting, scaled(10))
            finally:
                proxy.heal()
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            # Far sooner than the ttl (which nobody renews): given back by identity.
            give_up = loop.time() + scaled(10)
            while (await owner()).startswith(via.client_id):
                assert loop.time() < give_up, "the hold got by the timed-out acquire was left on the server"
                await asyncio.sleep(0.02)
            # Let the proxy's pumps still sleeping out the 0.3 s delay of reset
            # connections end before the proxy stops (else their errors go unretrieved).
            await asyncio.sleep(0.5)


async def test_an_outer_timeout_ends_an_acquire_on_a_black_holed_server_long_before_the_ttl(
    redis_fresh: RedisServer,
) -> None:
    """Cancelling an acquire whose request went into a black hole gives back
    what it may have got in the background: the cancellation itself is not held
    for the several ttls that clean-up may take."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=scaled(60))
        async with via:

            async def warm() -> None:
                async with via.lock("warm"):
                    pass

            await warm()
            proxy.blackhole()

            async def bounded() -> None:
                async with asyncio.timeout(scaled(0.3)):
                    await via.lock("into-the-hole").acquire()

            task = asyncio.create_task(bounded())
            try:
                done, _ = await asyncio.wait({task}, timeout=scaled(10))
                assert task in done, "the cancelled acquire was held up by its clean-up"
                with pytest.raises(TimeoutError):
                    task.result()
            finally:
                proxy.heal()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_an_anyio_cancel_scope_gives_back_a_hold_before_the_cancellation_propagates(
    redis_fresh: RedisServer, admin_fresh: aioredis.Redis
) -> None:
    """anyio delivers a scope's cancellation again and again while the task
    waits: the release-if-owner of a cancelled acquire still runs to the end
    before the scope is left (bounded), so nothing is held once it is."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=scaled(3))
        async with via:

            async def warm() -> None:
                async with via.lock("warm"):
                    pass

            await warm()
            proxy.delay(0.1)  # each way: the acquire runs on the server about 0.1 s after it is sent
            try:
                with anyio.move_on_after(0.15) as scope:
                    await via.lock("scoped").acquire()
                assert scope.cancelled_caught
                assert await admin_fresh.exists("asynclock:{scoped}") == 0, "a hold outlived the cancelled acquire"
            finally:
                proxy.heal()


async def test_aclose_from_inside_a_held_body_still_closes_everything(harness: Harness) -> None:
    """A task that closes its client from inside its own ``async with`` body:
    the close is not cut short by the cancellation of that very body (the
    lease is still released and the watchdog stopped); leaving the block
    raises LockLost."""
    locks = harness.connect(ttl=TTL)
    other = harness.connect(ttl=TTL)
    with pytest.raises(LockLost):
        async with locks.lock("self-closed"):
            await locks.aclose()
    assert insides.watchdog_task(insides.keeper(locks)) is None
    async with asyncio.timeout(10 * TTL), other.lock("self-closed"):
        pass


async def test_aclose_stops_a_rollback_that_cannot_reach_the_server(redis_fresh: RedisServer) -> None:
    """The clean-up of a cancelled acquire goes on in the background while the
    server does not answer; closing the client stops it (it does not swallow
    the cancellation and go on releasing through a closed client for ttls)."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=scaled(60))
        try:

            async def warm() -> None:
                async with via.lock("warm"):
                    pass

            await warm()
            proxy.blackhole()

            async def bounded() -> None:
                async with asyncio.timeout(scaled(0.3)):
                    await via.lock("rolled-back").acquire()

            with pytest.raises(TimeoutError):
                await asyncio.wait_for(bounded(), scaled(10))
            await asyncio.wait_for(via.aclose(), scaled(10))
            left = await hygiene.pending_asynclock_tasks(grace=scaled(1))
            assert not left, left
        finally:
            proxy.heal()
            await via.aclose()


async def test_listing_names_on_an_unreachable_server_raises_backend_unavailable(redis_fresh: RedisServer) -> None:
    """``names()`` (used by ``asynclock inspect`` without names) translates
    redis-py's errors like every other request: no raw redis exception."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        async with asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL) as locks:
            async with locks.lock("listed"):
                assert await locks.backend.names() == ["listed"]  # type: ignore[attr-defined]
                proxy.refuse()
                proxy.reset()
                with pytest.raises(BackendUnavailable):
                    await locks.backend.names()  # type: ignore[attr-defined]
                proxy.heal()


async def test_an_acquire_in_flight_while_its_client_closes_ends_with_backend_unavailable(
    redis_fresh: RedisServer,
) -> None:
    """The client is closed while an acquire's first try is on the wire and the
    lock is taken: the acquire ends with BackendUnavailable, not with an
    AssertionError from subscribing on a backend that was closed meanwhile."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        async with asynclock.connect(redis_fresh.url, ttl=TTL) as direct:
            async with direct.lock("in-flight"):
                closing = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL)
                try:

                    async def warm() -> None:
                        async with closing.lock("warm"):
                            pass

                    await warm()
                    proxy.delay(0.05)
                    task = asyncio.create_task(closing.lock("in-flight").acquire(timeout=10 * TTL))
                    await asyncio.sleep(0.01)  # the try is sent, its answer not back yet
                    await closing.aclose()
                    with pytest.raises(BackendUnavailable):
                        await asyncio.wait_for(task, scaled(10))
                finally:
                    proxy.heal()
                    await closing.aclose()


async def test_one_unexpected_renew_error_does_not_stop_the_watchdog(redis_server: RedisServer) -> None:
    """A backend bug that raises something unexpected from one renew call is
    retried like a failed renewal; it does not kill the one watchdog task
    (after which every lease of the client would silently go unrenewed)."""
    async with asynclock.connect(redis_server.url, ttl=TTL, prefix="keeper-survives") as locks:
        backend = locks.backend  # what renews the plain lock's leases
        real_renew = backend.renew
        failures = 0

        async def renew_failing_once(items: Any) -> Any:
            nonlocal failures
            if failures == 0:
                failures += 1
                raise ValueError("a bug in a backend")
            return await real_renew(items)

        backend.renew = renew_failing_once  # type: ignore[method-assign]
        async with locks.lock("survives") as lease:
            first_deadline = lease.expires_at
            while asyncio.get_running_loop().time() < first_deadline + TTL / 2:
                await asyncio.sleep(TTL / 10)
            assert failures == 1
            assert not lease.lost, lease.lost_reason


async def test_a_lease_past_its_deadline_is_not_held_and_not_reentered(harness: Harness) -> None:
    """The watchdog is not running (stalled, or stopped as here) and the lease's
    trusted deadline passes: ``held`` turns false and a re-entry raises
    LockLost instead of counting on an expired hold; the next acquire is fresh."""
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("stale")
    first = await lock.acquire()
    await insides.stop_renewing(locks)
    await asyncio.sleep(max(0.0, first.expires_at - asyncio.get_running_loop().time()) + 0.01)
    assert not lock.held
    with pytest.raises(LockLost):
        await lock.acquire()
    assert first.lost
    second = await lock.acquire(timeout=TTL + scaled(1))
    assert second is not first and not second.lost
    await lock.release()


async def test_a_release_lets_the_waiter_it_woke_in_this_process_go_first() -> None:
    """On memory:// (everything in-process) a task that releases and at once
    acquires again must not beat, every time, the waiter its release woke:
    that starved every other worker (one worker took 1,917 turns in a row)."""
    async with asynclock.connect("memory://", ttl=TTL) as locks:
        lock = locks.lock("turns")
        order: list[str] = []
        await lock.acquire()

        async def waiter() -> None:
            async with lock:
                order.append("waiter")

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.01)  # it waits now
        await lock.release()
        async with lock:  # straight back in
            order.append("releaser")
        await asyncio.wait_for(task, scaled(5))
        assert order == ["waiter", "releaser"]


async def test_the_watchdog_sleeps_through_acquires_and_releases_in_turn_and_still_renews() -> None:
    """A client that acquires and releases one lock over and over does not wake
    its watchdog each time (the released leases' heap entries wait until they
    are due, and are compacted when they pile up); the leases held meanwhile,
    including one with a shorter ttl, are still renewed in time."""
    async with asynclock.connect("memory://", ttl=TTL) as locks:
        lock = locks.lock("turns")
        await lock.acquire()
        await lock.release()
        keeper = insides.keeper(locks)
        assert keeper is not None
        wakes = 0

        def counted() -> None:
            nonlocal wakes
            wakes += 1

        insides.on_watchdog_wake(keeper, counted)
        for _ in range(500):
            await lock.acquire()
            await lock.release()
            assert insides.watchdog_heap_size(keeper) <= 70  # compacted past twice the live leases + 64
        assert wakes <= 1, f"the watchdog was woken {wakes} times by 500 acquires"
        # Held past several ttls, while stale entries of longer leases sit in the heap.
        short = locks.lock("short", ttl=TTL / 2)
        async with lock as long_lease, short as short_lease:
            for _ in range(50):
                async with locks.lock("churn"):
                    pass
            await asyncio.sleep(3 * TTL)
            assert not long_lease.lost and not short_lease.lost


async def test_a_waiter_with_no_timeout_gives_up_on_a_black_holed_server(redis_fresh: RedisServer) -> None:
    """A waiter queued on the server, with no timeout: the server stops
    answering (a black hole, no connection error) while the holder keeps the
    lock. The waiter's polls are bounded, so it ends with BackendUnavailable
    about a ttl after the server went silent, not never."""
    with TcpProxy("127.0.0.1", redis_fresh.port) as proxy:
        via = asynclock.connect(f"redis://127.0.0.1:{proxy.port}/0", ttl=TTL)
        direct = asynclock.connect(redis_fresh.url, ttl=30 * TTL)
        async with via, direct:
            holder = direct.lock("silent")
            await holder.acquire()
            waiting = asyncio.create_task(via.lock("silent").acquire())
            try:
                await queued(holder, 1)
                proxy.blackhole()
                with pytest.raises(BackendUnavailable):
                    # (a generous bound: about two ttls are expected; it took
                    # 16 s, 27 ttls, before each poll was bounded)
                    await asyncio.wait_for(waiting, 10 * TTL)
            finally:
                proxy.heal()
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            await holder.release()


class _NeverReached(memory.MemoryBackend):
    """A server whose name does not resolve at first and whose later lookups stall (a resolver
    that stops answering): the first try fails at once, every later one only times out."""

    tries = 0

    async def try_acquire(self, ref: Any, hold: str, ttl: float, *, enqueue: bool) -> Any:
        type(self).tries += 1
        if type(self).tries == 1:
            error = BackendUnavailable("server.invalid:6379 could not be reached: name not resolved")
            error.connect_timeout = scaled(0.5)
            raise error
        raise BackendUnavailable("server.invalid:6379 did not answer: TimeoutError()")


async def test_a_server_never_reached_is_given_up_after_the_connect_timeout_with_its_first_cause() -> None:
    loop = asyncio.get_running_loop()
    locks = asynclock.Locks(_NeverReached(prefix="never"), ttl=scaled(30))
    started = loop.time()
    try:
        with pytest.raises(BackendUnavailable, match="name not resolved"):
            async with asyncio.timeout(scaled(10)):
                await locks.lock("x").acquire()
        # after the connect timeout of the first failure, not after the 30 s ttl
        assert loop.time() - started < scaled(5)
        assert _NeverReached.tries > 1, "it was retried meanwhile"
    finally:
        await locks.aclose()


class _OvertakingTry(memory.MemoryBackend):
    """A client whose requests may overtake each other (a Cluster client's pooled connections):
    a try cut short on its way still runs on the server, a moment after the give-back that the
    caller's cancellation sent."""

    def __init__(self, *, prefix: str) -> None:
        super().__init__(prefix=prefix)
        self.late: list[asyncio.Task[Any]] = []

    async def try_acquire(self, ref: Any, hold: str, ttl: float, *, enqueue: bool) -> Any:
        async def on_its_way() -> Any:
            await asyncio.sleep(0.01)
            return await memory.MemoryBackend.try_acquire(self, ref, hold, ttl, enqueue=enqueue)

        task = asyncio.ensure_future(on_its_way())
        self.late.append(task)
        return await asyncio.shield(task)


async def test_a_try_cut_short_that_reaches_the_server_after_its_give_back_is_given_back_again() -> None:
    backend = _OvertakingTry(prefix="overtaken")
    locks = asynclock.Locks(backend, ttl=scaled(30))
    other = asynclock.Locks(memory.MemoryBackend(prefix="overtaken"), ttl=scaled(30))
    try:
        task = asyncio.create_task(locks.lock("x").acquire())
        await asyncio.sleep(0)  # (its try is on its way)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        [late] = backend.late
        assert isinstance(await late, asynclock.abc.Acquired), "the try ran after its give-back, and took the lock"
        # given back once more: free well before its 30 s ttl
        async with other.lock("x").acquire(timeout=scaled(1)):
            pass
    finally:
        await locks.aclose()
        await other.aclose()
