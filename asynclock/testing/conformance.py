"""The contract every backend keeps, as a test suite a backend runs against itself.

asynclock's own backends run it in the project's test suite; a backend
written elsewhere (see the Backend protocol in :mod:`asynclock.abc`) runs the
very same tests, the way ShedLock ships its lock-provider test kit. The
suite is the class :class:`Contract`: subclass it in a test module (its name
must start with ``Test`` for pytest to collect it) and give it a ``harness``
fixture that yields a :class:`Harness` for your backend, one per test::

    import pytest

    import asynclock
    from asynclock.testing.conformance import Contract, Harness


    class MyHarness(Harness):
        def open(self, **options):
            # ``options`` has ``prefix`` (this test's own), and maybe ``ttl`` and ``on_event``
            prefix = options.pop("prefix")
            return asynclock.Locks(MyBackend(server, prefix=prefix), **options)

        async def expire(self, name):
            ...  # delete the hold on ``name`` on the server, as an expiry would; True if there was one

        async def leftovers(self):
            ...  # what this test's prefix still has on the server: must be [] at the end


    @pytest.fixture
    async def harness():
        async with MyHarness() as h:
            yield h


    class TestMyBackend(Contract):
        pass

The tests are asyncio coroutines run by anyio's pytest plugin, which comes
with asynclock (each test is marked ``pytest.mark.anyio``). Run them with
``pytest -p anyio`` if plugins are not loaded automatically.

What a :class:`Harness` gives the tests:

* ``connect(**options)``: a new client of the backend under test, isolated
  from every other test by ``prefix``; the harness closes it at the end.
  Override :meth:`Harness.open` to make one (by default
  ``asynclock.connect(self.url, **options)``, for a backend with a URL).
* ``await expire(name)``: take the hold on ``name`` away on the server,
  without telling the client, as the server would when the lease expires.
* ``await leftovers()``: what is left on the server under this test's
  prefix (keys, nodes, rows) once every client has closed; the suite fails a
  test that leaves anything (fence counters, which must survive, aside).
* Capability flags: ``has_tokens`` (False if ``lease.token`` is always None:
  no safe fencing token, as with Redlock) and ``server_counts`` (False if the
  hold count of a re-entered lock lives in the client, so that
  ``info().hold_count`` says 1).

Times scale with the environment variable ``ASYNCLOCK_TEST_SCALE`` (``2``
doubles every ttl and time bound, for a slow machine or backend); the
tests' ttl is 0.6 s times it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import secrets
from types import TracebackType
from typing import Any

import pytest

import asynclock
from asynclock import LockLost, LockTimeout, NotHeld

__all__ = ["CLIENT_TESTS", "TTL", "Contract", "Harness", "ServerContract", "scaled"]

#: Multiplies every ttl and time bound of the suite (``ASYNCLOCK_TEST_SCALE``).
SCALE = float(os.environ.get("ASYNCLOCK_TEST_SCALE", "1"))


def scaled(seconds: float) -> float:
    """``seconds`` times ``ASYNCLOCK_TEST_SCALE``."""
    return seconds * SCALE


#: The lease time of the suite's locks.
TTL = scaled(0.6)


class Harness:
    """What the contract suite needs from a backend: made fresh for each test by
    a ``harness`` fixture, entered with ``async with`` (see the module's docs).

    Leaving it closes every client it made, fails the test if :meth:`leftovers`
    finds anything (unless the test failed already), then calls :meth:`close`.
    """

    #: Whether the backend gives fencing tokens (False: ``lease.token`` is always None).
    has_tokens: bool = True
    #: Whether the server keeps the hold count of a re-entered lock (``info().hold_count``).
    server_counts: bool = True

    def __init__(self, prefix: str | None = None) -> None:
        #: The key prefix of this test: every client :meth:`connect` makes uses it.
        self.prefix = prefix or f"t{secrets.token_hex(4)}"
        self._clients: list[asynclock.Locks] = []

    @property
    def url(self) -> str:
        """The URL the default :meth:`open` connects to."""
        raise NotImplementedError("give the harness a url, or override open()")

    def open(self, **options: Any) -> asynclock.Locks:
        """A new client of the backend under test with these ``connect`` options
        (``prefix`` always among them). Override it for a backend without a URL:
        ``asynclock.Locks(backend, ttl=..., on_event=...)`` takes a backend object."""
        return asynclock.connect(self.url, **options)

    def connect(self, **options: Any) -> asynclock.Locks:
        """A client of this test (``prefix`` defaults to :attr:`prefix`), closed when the harness is left."""
        options.setdefault("prefix", self.prefix)
        locks = self.open(**options)
        self._clients.append(locks)
        return locks

    async def expire(self, name: str) -> bool:
        """Remove the hold on the plain lock ``name`` on the server, as an expiry would
        (no notification to the client); whether there was one."""
        raise NotImplementedError

    async def leftovers(self) -> list[str]:
        """What this test's prefix still has on the server (keys, nodes, locks), fence counters aside."""
        raise NotImplementedError

    async def close(self) -> None:
        """Called last, whatever happened: drop what the test made on the server, close admin connections."""

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            for locks in self._clients:
                await locks.aclose()
            if exc_type is None:
                left = await self.leftovers()
                assert not left, f"test left locks behind: {left}"
        finally:
            await self.close()


def has_tokens(harness: Harness) -> bool:
    """Whether the backend gives fencing tokens (Redlock does not: its tokens are None)."""
    return bool(getattr(harness, "has_tokens", True))


async def free_now(locks: asynclock.Locks, name: str) -> None:
    """Take and give back ``name``, which must be free on the server (or become free
    within a hand-over), not only after a holder's ttl."""
    await locks.lock(name).acquire(timeout=TTL / 2)
    await locks.lock(name).release()


class Contract:
    """The contract tests (API.md's guarantees), for any backend: subclass it as
    ``class TestMyBackend(Contract)`` next to a ``harness`` fixture."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self) -> str:
        """asynclock runs on asyncio (anyio's plugin would try trio too, where installed)."""
        return "asyncio"

    async def test_acquire_release_and_lease_fields(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("basic")
        assert not lock.held
        lease = await lock.acquire()
        loop = asyncio.get_running_loop()
        assert lease.name == "basic"
        assert isinstance(lease.token, int) if has_tokens(harness) else lease.token is None
        assert lease.hold_count == 1
        assert lease.expires_at > loop.time()
        assert not lease.lost
        assert lock.held
        info = await lock.info()
        assert info.owner is not None and info.owner.startswith(locks.client_id)
        assert info.key == lock.key
        assert info.token == lease.token
        await lock.release()
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_async_with_releases_on_exit_and_on_error(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("with")
        async with lock as lease:
            assert lock.held and lease.hold_count == 1
        assert not lock.held
        with pytest.raises(ZeroDivisionError):
            async with lock:
                1 / 0  # noqa: B018
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_reentry_counts_holds_and_keeps_token(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("re")
        async with lock as outer:
            async with lock as inner:
                assert inner is outer
                assert inner.hold_count == 2
                if harness.server_counts:
                    assert (await lock.info()).hold_count == 2
            assert outer.hold_count == 1 and lock.held
            assert (await lock.info()).owner is not None
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_other_task_waits_and_gets_a_higher_token(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("handoff")
        first = await lock.acquire()
        got = asyncio.Event()
        tokens: list[int | None] = []

        async def other() -> None:
            async with lock as lease:
                tokens.append(lease.token)
                got.set()

        task = asyncio.create_task(other())
        await asyncio.sleep(0.05)
        assert not got.is_set(), "another task of the same process must wait"
        await lock.release()
        await asyncio.wait_for(task, scaled(5))
        if has_tokens(harness):
            assert first.token is not None and tokens[0] is not None and tokens[0] > first.token

    async def test_two_clients_exclude_each_other_with_increasing_tokens(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        inside = 0
        tokens: list[int | None] = []

        async def worker(locks: asynclock.Locks) -> None:
            nonlocal inside
            for _ in range(6):
                async with locks.lock("shared") as lease:
                    inside += 1
                    assert inside == 1, "two holders at once"
                    assert (lease.token is not None) == has_tokens(harness)
                    tokens.append(lease.token)
                    await asyncio.sleep(0.002)
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(worker(a), worker(b), worker(a), worker(b)), scaled(20))
        assert len(tokens) == 24
        if has_tokens(harness):
            numbers = [token for token in tokens if token is not None]
            assert numbers == sorted(numbers) and len(set(numbers)) == len(tokens)

    async def test_timeout_zero_tries_once_and_timeout_bounds_the_wait(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        async with a.lock("busy"):
            with pytest.raises(LockTimeout) as caught:
                await b.lock("busy").acquire(timeout=0)
            assert isinstance(caught.value, TimeoutError)
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(LockTimeout):
                await b.lock("busy").acquire(timeout=0.3)
            assert loop.time() - start >= 0.29
            assert not b.lock("busy").held

    async def test_release_by_non_owner_double_release_and_after_loss(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("owner")
        lease = await lock.acquire()

        async def intruder() -> None:
            with pytest.raises(NotHeld):
                await lock.release()

        await asyncio.create_task(intruder())
        other_client = harness.connect(ttl=TTL)
        with pytest.raises(NotHeld):
            await other_client.lock("owner").release()
        info = await lock.info()
        assert info.owner is not None and info.token == lease.token, "a non-owner release changed the server"
        await lock.release()
        with pytest.raises(NotHeld):
            await lock.release()

        lease = await lock.acquire()
        assert await harness.expire("owner")
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        with pytest.raises(NotHeld):
            await lock.release()

    @pytest.mark.parametrize(
        ("make", "error"),
        [
            (lambda locks: locks.lock(""), ValueError),
            (lambda locks: locks.lock(42), TypeError),
            (lambda locks: locks.lock(b"bytes"), TypeError),
            (lambda locks: locks.lock("x" * 100_000), ValueError),
            (lambda locks: locks.lock("\udcff"), ValueError),
            (lambda locks: locks.lock("n", ttl=0), ValueError),
            (lambda locks: locks.lock("n", ttl=-1), ValueError),
            (lambda locks: locks.lock("n", ttl=math.nan), ValueError),
            (lambda locks: locks.lock("n", ttl=math.inf), ValueError),
            (lambda locks: locks.lock("n", ttl="5"), TypeError),
            (lambda locks: locks.lock("n", ttl=True), TypeError),
        ],
    )
    async def test_bad_arguments_raise_before_any_io(
        self, harness: Harness, make: object, error: type[Exception]
    ) -> None:
        locks = harness.connect(ttl=TTL)
        assert callable(make)
        with pytest.raises(error):
            make(locks)

    @pytest.mark.parametrize("timeout", [-1, -0.001, math.nan, "1"])
    async def test_bad_timeout_raises_before_any_io(self, harness: Harness, timeout: object) -> None:
        locks = harness.connect(ttl=TTL)
        with pytest.raises((ValueError, TypeError)):
            await locks.lock("t").acquire(timeout=timeout)  # type: ignore[arg-type]
        assert (await locks.lock("t").info()).owner is None

    async def test_renewal_keeps_the_lock_past_its_ttl(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        async with a.lock("long") as lease:
            first_deadline = lease.expires_at
            await asyncio.sleep(TTL * 3)
            assert not lease.lost
            assert lease.expires_at > first_deadline
            with pytest.raises(LockTimeout):
                await b.lock("long").acquire(timeout=0)

    async def test_loss_cancels_the_body_and_raises_lock_lost(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("lost")
        loop = asyncio.get_running_loop()
        cancelled_at: list[float] = []
        child_cancelled = asyncio.Event()
        deadline_seen: list[float] = []

        async def child() -> None:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                child_cancelled.set()
                raise

        with pytest.raises(LockLost) as caught:
            async with lock as lease:
                assert await harness.expire("lost")
                deadline_seen.append(lease.expires_at)
                try:
                    async with asyncio.TaskGroup() as group:
                        group.create_task(child())
                        await asyncio.sleep(100)
                finally:
                    cancelled_at.append(loop.time())
        assert caught.value.name == "lost"
        assert lease.lost and lease.lost_reason
        assert child_cancelled.is_set(), "a task group inside the body is cancelled with it"
        # cancelled by the next renewal at the latest, and never after the trusted deadline
        assert cancelled_at[0] <= deadline_seen[0] + 0.05
        assert await asyncio.wait_for(lease.wait_lost(), 1) == lease.lost_reason
        assert not lock.held

    async def test_a_holder_that_stops_renewing_loses_the_lock_after_its_ttl(self, harness: Harness) -> None:
        dead = harness.connect(ttl=TTL)
        alive = harness.connect(ttl=TTL)
        lease = await dead.lock("crash").acquire()
        # the holder "dies": its watchdog stops and it never releases
        assert dead._keeper is not None
        await dead._keeper.aclose()
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with alive.lock("crash") as taken:
            if has_tokens(harness):
                assert taken.token is not None and lease.token is not None and taken.token > lease.token
        assert loop.time() - start <= TTL + scaled(1.0)
        assert lease.lost  # its own trusted deadline has passed too

    async def test_cancelled_waiter_leaves_nothing_behind(self, harness: Harness) -> None:
        a = harness.connect(ttl=TTL)
        b = harness.connect(ttl=TTL)
        holder = await a.lock("cw").acquire()
        waiter = asyncio.create_task(b.lock("cw").acquire())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await a.lock("cw").release()
        assert (holder.token is not None) == has_tokens(harness)
        # the cancelled waiter holds nothing: a third party gets it at once
        c = harness.connect(ttl=TTL)
        async with c.lock("cw"):
            pass

    async def test_cancelling_acquire_or_release_at_random_points_never_leaves_a_hold(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        rng = random.Random(1234)
        cancelled = 0
        lock = locks.lock("fuzz")

        async def use() -> None:
            await lock.acquire()
            await lock.release()

        async def hold_briefly(taken: asyncio.Event) -> None:
            async with other.lock("fuzz"):
                taken.set()
                await asyncio.sleep(rng.uniform(0, 0.003))

        for i in range(60):
            blocker = None
            if i % 3 == 0:
                # Taken by another client and let go a moment later: the
                # cancellation lands in the wait, or around the hand-over. (An
                # uncontended in-process acquire and release may never yield.)
                taken = asyncio.Event()
                blocker = asyncio.create_task(hold_briefly(taken))
                await taken.wait()
            task = asyncio.create_task(use())
            if i % 2:
                await asyncio.sleep(rng.uniform(0, 0.003))
            else:  # a few event-loop turns: lands inside even an in-process acquire or release
                for _ in range(rng.randrange(1, 6)):
                    await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
            if blocker is not None:
                await blocker
            # wherever the cancellation landed, the lock is free for somebody else
            # right away (not after the ttl)
            async with asyncio.timeout(TTL / 2):
                async with other.lock("fuzz"):
                    pass
        assert cancelled > 0

    async def test_timeout_via_asyncio_timeout_keeps_the_owner(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("own")
        async with asyncio.timeout(scaled(5)):
            await lock.acquire()
        assert lock.held
        await lock.release()

    async def test_many_waiters_all_get_it_one_at_a_time(self, harness: Harness) -> None:
        clients = [harness.connect(ttl=TTL) for _ in range(3)]
        inside = 0
        done = 0

        async def worker(locks: asynclock.Locks) -> None:
            nonlocal inside, done
            for _ in range(4):
                async with locks.lock("crowd"):
                    inside += 1
                    assert inside == 1
                    await asyncio.sleep(0.001)
                    inside -= 1
                    done += 1

        await asyncio.wait_for(asyncio.gather(*(worker(clients[i % 3]) for i in range(9))), scaled(30))
        assert done == 36

    async def test_events_are_reported(self, harness: Harness) -> None:
        events: list[asynclock.LockEvent] = []
        locks = harness.connect(ttl=TTL, on_event=events.append)
        lock = locks.lock("ev")
        async with lock:
            await asyncio.sleep(TTL * 0.6)  # at least one renewal
            other = asyncio.create_task(lock.acquire(timeout=0))
            with pytest.raises(LockTimeout):
                await other
        lease = await lock.acquire()
        await harness.expire("ev")
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        await asyncio.sleep(0)
        kinds = [event.kind for event in events]
        for kind in ("acquired", "renewed", "timeout", "released", "lost"):
            assert kind in kinds, kinds
        released = next(e for e in events if e.kind == "released")
        assert released.held_s is not None and released.held_s > 0
        lost = next(e for e in events if e.kind == "lost")
        assert lost.reason

    async def test_a_failing_event_callback_is_logged_not_raised(
        self, harness: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(event: asynclock.LockEvent) -> None:
            raise RuntimeError("callback bug")

        locks = harness.connect(ttl=TTL, on_event=broken)
        async with locks.lock("cb"):
            pass
        await asyncio.sleep(0.01)
        assert "callback bug" in caplog.text

    async def test_aclose_releases_what_the_client_holds(self, harness: Harness) -> None:
        a = harness.connect(ttl=scaled(10))
        b = harness.connect(ttl=scaled(10))
        await a.lock("close").acquire()
        await a.aclose()
        async with b.lock("close") as lease:  # at once, not after the 10 s ttl
            assert (lease.token is not None) == has_tokens(harness)
        with pytest.raises(RuntimeError):
            await a.lock("close").acquire()

    async def test_lease_outside_async_with_reports_loss(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("manual")
        lease = await lock.acquire()
        waiting = asyncio.create_task(lease.wait_lost())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await harness.expire("manual")
        reason = await asyncio.wait_for(waiting, scaled(5))
        assert reason and lease.lost and not lock.held

    async def test_unicode_and_odd_names_are_distinct_locks(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        names = ["ключ", "a/b", "a//b", "a/b/", "..", ".", "a b", "{x}", "x}", "%2F", "a\x00b", "a\nb", "🔒"]
        leases = []
        for name in names:
            leases.append(await locks.lock(name).acquire(timeout=0))
        keys = {locks.lock(name).key for name in names}
        assert len(keys) == len(names)
        for name in names:
            await locks.lock(name).release()

    async def test_body_is_cancelled_at_its_deadline_even_if_the_watchdog_stalls(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        loop = asyncio.get_running_loop()
        ended_at: list[float] = []
        with pytest.raises(LockLost):
            async with locks.lock("stall") as lease:
                assert locks._keeper is not None
                await locks._keeper.aclose()  # no more renewals, and nobody tells the lease
                try:
                    await asyncio.sleep(100)
                finally:
                    ended_at.append(loop.time())
        assert lease.lost
        assert ended_at[0] <= lease.expires_at + 0.05

    async def test_held_time_in_events_leaves_out_the_wait(self, harness: Harness) -> None:
        """``held_s`` counts from the grant: a waiter that releases at once held it
        for less time than it waited (on every backend, queueing ones included)."""
        events: list[asynclock.LockEvent] = []
        first = harness.connect(ttl=TTL)
        second = harness.connect(ttl=TTL, on_event=events.append)
        holder, waiter = first.lock("held-time"), second.lock("held-time")
        await holder.acquire()
        await waiter.info()  # connected now: what the waiter's acquire measures is all waiting

        async def acquire_and_release() -> None:
            await waiter.acquire()
            await waiter.release()

        waiting = asyncio.create_task(acquire_and_release())
        await asyncio.sleep(0.3)
        await holder.release()
        await asyncio.wait_for(waiting, scaled(10))
        async with asyncio.timeout(scaled(5)):
            while not any(event.kind == "released" for event in events):
                await asyncio.sleep(0.01)  # events are delivered on later loop iterations
        acquired = next(event for event in events if event.kind == "acquired")
        released = next(event for event in events if event.kind == "released")
        assert acquired.wait_s is not None and released.held_s is not None
        assert released.held_s < acquired.wait_s, (released.held_s, acquired.wait_s)

    async def test_a_hold_whose_owner_task_ended_is_abandoned_and_released_at_once(
        self, harness: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A task that ends still holding (returns, raises, is cancelled) does not
        keep the lock renewed for ever: the hold is released on the server at once,
        with a WARNING naming the lock and the task, and an "abandoned" event."""
        events: list[asynclock.LockEvent] = []
        locks = harness.connect(ttl=TTL, on_event=events.append)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("abandoned")
        holding = asyncio.Event()

        async def returns() -> None:
            await lock.acquire()

        async def raises() -> None:
            await lock.acquire()
            await lock.acquire()  # both holds go
            raise RuntimeError("the handler failed")

        async def is_cancelled() -> None:
            await lock.acquire()
            holding.set()
            await asyncio.sleep(3600)

        for ending in (returns, raises, is_cancelled):
            holding.clear()
            task = asyncio.create_task(ending(), name=f"owner-{ending.__name__}")
            if ending is is_cancelled:
                await holding.wait()
                task.cancel()
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                await task
            await free_now(other, "abandoned")  # the renewals would have kept it for ever
        async with asyncio.timeout(scaled(5)):
            while sum(event.kind == "abandoned" for event in events) < 3:
                await asyncio.sleep(0.01)
        warnings = [r.getMessage() for r in caplog.records if r.name == "asynclock" and r.levelno == logging.WARNING]
        for name in ("owner-returns", "owner-raises", "owner-is_cancelled"):
            assert any("'abandoned'" in text and name in text for text in warnings), warnings
        assert all(event.name == "abandoned" for event in events if event.kind == "abandoned")
        assert not lock.held

    async def test_lease_release_from_another_task_cancels_the_holders_body(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("handed")
        holding = asyncio.Event()
        leases: list[asynclock.Lease] = []

        async def body() -> None:
            async with lock as lease:
                await lock.acquire()  # every hold goes with the lease
                leases.append(lease)
                holding.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(body())
        await holding.wait()
        await leases[0].release()
        with pytest.raises(LockLost, match=r"released by lease\.release"):
            await task
        with pytest.raises(NotHeld):
            await leases[0].release()
        await free_now(other, "handed")
        # From inside its own block, the holder's task leaves quietly.
        async with lock as lease:
            await lease.release()
            assert not lock.held
        await free_now(other, "handed")

    async def test_detached_lease_belongs_to_no_task_and_lives_until_released(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        other = harness.connect(ttl=TTL)
        lock = locks.lock("detached")
        lease = await asyncio.create_task(lock.acquire(detached=True))  # that task ends at once
        await asyncio.sleep(TTL * 1.2)  # renewed, not abandoned
        assert not lease.lost
        with pytest.raises(LockTimeout):
            await other.lock("detached").acquire(timeout=0)
        assert not lock.held  # no task holds it
        with pytest.raises(NotHeld):
            await lock.release()
        with pytest.raises(LockTimeout):  # no re-entry: a second detached acquire waits like anyone
            await lock.acquire(timeout=0, detached=True)
        await lease.release()
        await free_now(other, "detached")
        with pytest.raises(TypeError):
            await lock.acquire(detached=1)  # type: ignore[arg-type]

    async def test_a_closed_client_says_so(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("closing")
        lease = await lock.acquire()
        await locks.aclose()
        for make in (lambda: locks.lock("x"), lambda: locks.rw_lock("x"), lambda: locks.semaphore("x", permits=2)):
            with pytest.raises(RuntimeError, match="client is closed"):
                make()
        for call in (lock.acquire, lock.release, lock.info):
            with pytest.raises(RuntimeError, match="client is closed"):
                await call()
        with pytest.raises(NotHeld):
            await lease.release()  # released by the close


#: The tests of what the client does by itself, the same whatever serves the lock:
#: argument checks, events, the owner task and detached leases, the watchdog
#: stopped, the client closed. A backend runs them in its :class:`Contract`;
#: :class:`ServerContract` leaves them out.
CLIENT_TESTS = (
    "test_bad_arguments_raise_before_any_io",
    "test_bad_timeout_raises_before_any_io",
    "test_events_are_reported",
    "test_a_failing_event_callback_is_logged_not_raised",
    "test_timeout_via_asyncio_timeout_keeps_the_owner",
    "test_body_is_cancelled_at_its_deadline_even_if_the_watchdog_stalls",
    "test_a_hold_whose_owner_task_ended_is_abandoned_and_released_at_once",
    "test_lease_release_from_another_task_cancels_the_holders_body",
    "test_detached_lease_belongs_to_no_task_and_lives_until_released",
    "test_a_closed_client_says_so",
)


class ServerContract(Contract):
    """:class:`Contract` without its :data:`CLIENT_TESTS`: for one more primitive, or one
    more way of connecting, of a backend that already runs the whole contract."""


for _name in CLIENT_TESTS:
    assert callable(getattr(Contract, _name)), _name
    setattr(ServerContract, _name, None)
