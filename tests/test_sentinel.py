"""Redis through Sentinel: a real primary, a replica and three sentinels, and
real failovers (the primary is killed, the sentinels promote the replica).

The contract suite runs here too, on a topology shared by the module (the
``harness`` fixture below overrides the per-backend one); the failover
tests each start a topology of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockLost, LockTimeout
from asynclock.abc import LockRef, RenewItem
from asynclock.backends.sentinel import SentinelBackend
from asynclock.testing.conformance import ServerContract
from tests.harnesses import RedisHarness, add_idle_connection, insides
from tests.servers import RedisServer, scaled
from tests.servers.redis_topologies import SentinelServer, SentinelSetup

pytestmark = pytest.mark.anyio


class SentinelHarness(RedisHarness):
    """The Redis harness, connecting through the sentinels; faults go to the primary."""

    kind = "redis+sentinel"

    def __init__(self, setup: SentinelSetup) -> None:
        super().__init__(setup.primary)
        self.setup = setup

    @property
    def url(self) -> str:
        return self.setup.url


@pytest.fixture(scope="module")
def shared_setup() -> Iterator[SentinelSetup]:
    group = SentinelSetup()
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


@pytest.fixture
async def harness(shared_setup: SentinelSetup) -> AsyncIterator[SentinelHarness]:
    h = SentinelHarness(shared_setup)
    async with h:
        yield h


class TestContract(ServerContract):
    """The conformance suite, through the sentinels (with this module's ``harness``)."""


async def test_an_operator_breaks_a_lock_through_the_sentinels(harness: SentinelHarness) -> None:
    holder, waiter, operator = (harness.connect(ttl=scaled(0.6)) for _ in range(3))
    inside = asyncio.Event()

    async def stuck() -> None:
        async with holder.lock("stuck"):
            inside.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(stuck())
    await asyncio.wait_for(inside.wait(), scaled(5))
    got = asyncio.create_task(waiter.lock("stuck").acquire(detached=True))
    async with asyncio.timeout(scaled(5)):
        while not (await operator.lock("stuck").info()).waiters:
            await asyncio.sleep(0.01)
    broken = await operator.break_lock("stuck")
    assert broken is not None and broken.owner is not None and broken.owner.startswith(holder.client_id)
    with pytest.raises(LockLost):
        await asyncio.wait_for(task, scaled(4))
    lease = await asyncio.wait_for(got, scaled(5))
    assert broken.token is not None and lease.token is not None and lease.token > broken.token
    await lease.release()


@pytest.fixture
def setup() -> Iterator[SentinelSetup]:
    """A topology of this test's own: it kills the primary."""
    group = SentinelSetup()
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


def sentinel_backend(locks: asynclock.Locks) -> SentinelBackend:
    backend = locks.backend
    assert isinstance(backend, SentinelBackend)
    return backend


async def replicated(port: int, key: str, present: bool = True) -> None:
    """Wait until the server on ``port`` has (or has not) ``key``."""
    admin = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        async with asyncio.timeout(scaled(10)):
            while bool(await admin.exists(key)) != present:
                await asyncio.sleep(0.01)
    finally:
        await admin.aclose()


async def fail_over(setup: SentinelSetup) -> int:
    """Kill the primary and wait until the sentinels promoted the replica; its port."""
    old = setup.current_primary_port()
    assert old is not None
    setup.server_on(old).kill()
    return await asyncio.to_thread(setup.wait_failover, old)


def test_url_parsing() -> None:
    locks = asynclock.connect("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/mymaster/3?socket_timeout=2")
    backend = sentinel_backend(locks)
    assert len(backend.sentinel.sentinels) == 2
    kwargs = backend.client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (3, "pw", 2.0)
    with pytest.raises(ValueError, match="service_name"):
        asynclock.connect("redis+sentinel://127.0.0.1:1")
    with pytest.raises(ValueError, match="host:port"):
        asynclock.connect("redis+sentinel://127.0.0.1/mymaster")


def test_url_takes_the_replicas_option() -> None:
    locks = asynclock.connect("redis+sentinel://127.0.0.1:1/mymaster?replicas=1&replica_timeout=0.25")
    backend = sentinel_backend(locks)
    assert backend.replicas == 1
    assert "replicas" not in backend.client.connection_pool.connection_kwargs
    with pytest.raises(ValueError, match="replica"):
        asynclock.connect("redis+sentinel://127.0.0.1:1/mymaster?replicas=-1")
    with pytest.raises(ValueError, match="replica"):
        asynclock.connect("redis+sentinel://127.0.0.1:1/mymaster?replicas=many")


async def test_with_replicas_an_acquire_survives_a_failover_right_after_it(setup: SentinelSetup) -> None:
    """``?replicas=1``: the acquire returns only once the replica has the key, so
    killing the primary the moment it returns cannot hand the lock to a second
    holder on the promoted replica. (With no replica left behind it, the new
    primary cannot confirm renewals, so the lease ends at its deadline.)"""
    ttl = scaled(6)
    url = f"{setup.url}?replicas=1"
    async with (
        asynclock.connect(url, ttl=ttl, prefix="synced") as holder,
        asynclock.connect(setup.url, ttl=ttl, prefix="synced") as other,
    ):
        await holder.lock("kept").acquire()
        new_port = await fail_over(setup)  # no wait for replication: WAIT did that
        assert new_port == setup.replica.port
        async with asyncio.timeout(scaled(15)):
            while True:  # the sentinels may still be telling their clients about the new primary
                try:
                    info = await other.lock("kept").info()
                    break
                except BackendUnavailable:
                    await asyncio.sleep(0.1)
        assert info.owner is not None and info.owner.startswith(holder.client_id)
        with pytest.raises(LockTimeout):
            await other.lock("kept").acquire(timeout=0)


async def test_after_a_failover_the_client_follows_the_new_primary(setup: SentinelSetup) -> None:
    ttl = scaled(6)
    prefix = "follow"
    async with (
        asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as holder,
        asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as other,
    ):
        order: list[str] = []
        lease = await holder.lock("kept").acquire()
        await replicated(setup.replica.port, f"{prefix}:{{kept}}:x")

        async def wait_for_it() -> None:
            async with other.lock("kept"):
                order.append("waiter got it")

        waiter = asyncio.create_task(wait_for_it())
        await asyncio.sleep(0.2)
        new_port = await fail_over(setup)
        assert new_port == setup.replica.port
        # the hold survived (it had reached the replica): renewals go on, on the new primary
        renewed = lease.expires_at
        async with asyncio.timeout(scaled(15)):
            while lease.expires_at == renewed:
                await asyncio.sleep(0.05)
        assert not lease.lost and not waiter.done()
        info = await holder.lock("kept").info()
        assert info.owner is not None and info.owner.startswith(holder.client_id)
        # the waiter's listener reconnected to the new primary: the release wakes it
        order.append("released")
        await holder.lock("kept").release()
        await asyncio.wait_for(waiter, scaled(10))
        assert order == ["released", "waiter got it"]
        async with holder.lock("fresh") as fresh:
            assert fresh.token is not None


async def test_a_hold_that_did_not_survive_the_failover_is_lost_not_continued(setup: SentinelSetup) -> None:
    ttl = scaled(9)
    prefix = "gone"
    async with (
        asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as holder,
        asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as other,
    ):
        key = f"{prefix}:{{gone}}:x"  # the plain lock, held
        with pytest.raises(LockLost) as caught:
            async with holder.lock("gone") as lease:
                # the acquire "did not reach" the replica before the primary died
                await replicated(setup.replica.port, key)
                replica = aioredis.Redis(host="127.0.0.1", port=setup.replica.port)
                await replica.delete(key)
                await replica.aclose()
                await fail_over(setup)
                await asyncio.sleep(scaled(60))  # cancelled by the loss
        assert lease.lost
        # lost because the new primary answered "not the holder" at a renewal,
        # not because renewals failed until the trusted deadline
        assert "no longer has this hold" in str(caught.value), caught.value
        async with other.lock("gone", ttl=scaled(1)):
            pass


async def test_readonly_from_a_demoted_primary_counts_as_loss(setup: SentinelSetup) -> None:
    ttl = scaled(6)
    prefix = "demoted"
    old_port = setup.primary.port
    async with asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as locks:
        lease = await locks.lock("ro").acquire()
        await replicated(setup.replica.port, f"{prefix}:{{ro}}:x")
        new_port = await fail_over(setup)
        # the old primary comes back (empty) as a replica of the new one, once every
        # sentinel knows of the failover
        await asyncio.to_thread(setup.wait_sentinels_agree, new_port)
        setup.primary.extra += ["--replicaof", "127.0.0.1", str(new_port)]
        await asyncio.to_thread(setup.primary.restart_empty)
        admin = aioredis.Redis(host="127.0.0.1", port=old_port)
        try:
            async with asyncio.timeout(scaled(30)):
                while (await admin.info("replication"))["role"] != "slave":
                    await asyncio.sleep(0.1)
        finally:
            await admin.aclose()

        item = RenewItem(LockRef("lock", "ro"), insides.hold_of(lease), ttl)
        # the Sentinel client on a connection that still points at the demoted
        # primary: the renewal is lost, not a success, and the next request
        # follows the sentinels to the real primary
        backend = sentinel_backend(locks)

        async def stale_connection() -> Any:
            """The next request of the lock (on its own connections) goes to the old primary."""
            stale = backend.client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
            await stale.connect_to(("127.0.0.1", old_port))
            add_idle_connection(backend.connection, stale)
            return stale

        stale = await stale_connection()
        assert await backend.renew([item]) == [False]  # the plain lock's own renewal
        assert not stale.is_connected
        # an acquire there is "server unavailable" (retried), never a success
        await stale_connection()
        with pytest.raises(BackendUnavailable, match="READONLY"):
            await backend.try_acquire(LockRef("lock", "other"), "someone", ttl, enqueue=False)
        # the next renewal asks the sentinels (which may need a moment to
        # agree on a healthy primary again): it lands on the new primary
        async with asyncio.timeout(scaled(10)):
            while (answer := await backend.renew([item])) != [True]:
                assert isinstance(answer[0], BackendUnavailable), answer
                await asyncio.sleep(0.05)
        async with asynclock.connect(setup.url, ttl=ttl, prefix=prefix) as other:
            with pytest.raises(LockTimeout):
                await other.lock("ro").acquire(timeout=0)
            await locks.lock("ro").release()
            async with other.lock("ro"):
                pass


async def test_a_primary_that_refuses_the_client_is_a_configuration_error_naming_it(
    shared_setup: SentinelSetup, caplog: pytest.LogCaptureFixture
) -> None:
    """Credentials or a database the primary refuses: raised at once by an
    acquire that would wait for ever, naming the primary the sentinels gave,
    quoting it, and never showing the password."""
    caplog.set_level(logging.DEBUG, logger="asynclock")
    wrong = "wr0ng-Pa55w0rd"
    primary = shared_setup.current_primary_port()
    for url, words in [
        (
            shared_setup.url.replace("redis+sentinel://", f"redis+sentinel://locker:{wrong}@"),
            "invalid username-password",
        ),
        (f"{shared_setup.url}/99", "DB index is out of range"),
    ]:
        with pytest.raises(ConfigurationError):
            async with asyncio.timeout(scaled(3)), asynclock.connect(url):
                pass  # entering makes a round trip, which meets the refusal
        locks = asynclock.connect(url)  # used without being opened: its first acquire meets it
        try:
            with pytest.raises(ConfigurationError) as caught:
                async with asyncio.timeout(scaled(3)):  # not retried for a ttl (30 s)
                    await locks.lock("refused").acquire()
        finally:
            await locks.aclose()
        text = str(caught.value)
        assert f"'mymaster' at 127.0.0.1:{primary}" in text and words in text, text
        assert wrong not in text
    assert all(wrong not in record.getMessage() for record in caplog.records)


@pytest.fixture
def guarded() -> Iterator[tuple[RedisServer, SentinelServer]]:
    """A primary that wants the password "data-pw", watched by one sentinel that wants "sentinel-pw"."""
    primary = RedisServer(password="data-pw")
    sentinel = None
    try:
        primary.start()
        sentinel = SentinelServer(primary.port, quorum=1, password="sentinel-pw", primary_password="data-pw")
        sentinel.start()
        yield primary, sentinel
    finally:
        if sentinel is not None:
            sentinel.cleanup()
        primary.cleanup()


async def test_a_password_wanted_by_the_sentinels_or_the_primary_is_named_with_where_it_goes(
    guarded: tuple[RedisServer, SentinelServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Without sentinel_password the sentinels' refusal says to add it; with it, the
    primary's says to put its password before the hosts; with both, locks work."""
    caplog.set_level(logging.DEBUG, logger="asynclock")
    primary, sentinel = guarded
    hosts = f"127.0.0.1:{sentinel.port}"
    for url, words in [
        (
            f"redis+sentinel://{hosts}/mymaster",
            f"Redis sentinel at {hosts} wants a password, and none was given: add ?sentinel_password=PASSWORD",
        ),
        (
            f"redis+sentinel://{hosts}/mymaster?sentinel_password=sentinel-pw",
            f"Redis primary 'mymaster' at 127.0.0.1:{primary.port} wants a password, and none was given:"
            f" put it in the URL, redis+sentinel://:PASSWORD@{hosts}/mymaster",
        ),
    ]:
        with pytest.raises(ConfigurationError) as caught:
            async with asyncio.timeout(scaled(5)), asynclock.connect(url):
                pass  # entering makes a round trip, which meets the refusal
        assert words in str(caught.value), str(caught.value)
    url = f"redis+sentinel://:data-pw@{hosts}/mymaster?sentinel_password=sentinel-pw"
    async with asynclock.connect(url) as locks:
        async with locks.lock("guarded") as lease:
            assert lease.hold_count == 1
    assert all("-pw" not in record.getMessage() for record in caplog.records)


async def test_an_election_through_the_sentinels_hands_over_on_resign_and_is_observed(
    harness: SentinelHarness,
) -> None:
    """Elections on the primary the sentinels name: candidates in line, a resign hands
    leadership to the next at once (a 30 s ttl: not by an expiry), observers hear of each
    change on the election's channel."""
    a, b, watcher = harness.connect(ttl=30), harness.connect(ttl=30), harness.connect(ttl=30)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    first = a.election("e", identity="a")
    async with first.leadership() as term:
        assert await asyncio.wait_for(anext(changes), scaled(5)) == asynclock.Leader("a", term.token, None)
        seen = asyncio.Event()
        taking = asyncio.create_task(_lead_until(b.election("e", identity="b"), seen))
        async with asyncio.timeout(scaled(5)):
            while (await first.info()).waiters != 1:
                await asyncio.sleep(0.01)
        await first.resign()
    second = await asyncio.wait_for(anext(changes), scaled(2))
    assert second is not None and second.identity == "b"
    assert term.token is not None and second.token is not None and second.token > term.token
    seen.set()
    assert await asyncio.wait_for(taking, scaled(5)) == second.token
    assert await asyncio.wait_for(anext(changes), scaled(5)) is None
    await changes.aclose()  # type: ignore[attr-defined]


async def _lead_until(election: asynclock.Election, done: asyncio.Event) -> int | None:
    async with election.leadership() as term:
        await done.wait()
        return term.token
