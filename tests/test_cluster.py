"""Redis Cluster: a real three-primary cluster made by the fixtures (the session's, but
for tests that kill or pause a node).

The whole contract suite runs here too (the ``harness`` fixture below
overrides the per-backend one), then what only a cluster has: renewals
grouped by slot, wake-ups by sharded pub/sub, a slot that moves to another
node while its lock is held, and an election's hand-overs on shard channels
of its slot (the generic election tests run on the cluster in
``test_election.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockTimeout
from asynclock.abc import LockRef, RenewItem
from asynclock.backends.cluster import ClusterBackend
from asynclock.testing.conformance import ServerContract
from tests.harnesses import eventually, insides, listener_port
from tests.harnesses.cluster import ClusterHarness, cluster_backend, handovers_listening, shard_of
from tests.servers import scaled
from tests.servers.proxy import TcpProxy
from tests.servers.redis_topologies import ClusterSetup

pytestmark = pytest.mark.anyio


@pytest.fixture
def cluster(redis_cluster: ClusterSetup) -> ClusterSetup:
    """The session's cluster."""
    return redis_cluster


@pytest.fixture
async def harness(cluster: ClusterSetup) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(cluster)
    async with h:
        yield h


class TestContract(ServerContract):
    """The conformance suite, on the cluster (with this module's ``harness``)."""


async def script_calls(cluster: ClusterSetup) -> int:
    """EVALSHA calls served by all nodes so far."""
    total = 0
    for server in cluster.servers:
        admin = aioredis.Redis(host="127.0.0.1", port=server.port)
        try:
            stats = await admin.info("commandstats")
        finally:
            await admin.aclose()
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


async def shard_channels(node: aioredis.Redis) -> list[bytes]:
    answer = await node.execute_command("PUBSUB", "SHARDCHANNELS")  # type: ignore[no-untyped-call]
    return list(answer)


def test_url_and_client_select_the_cluster_backend(cluster: ClusterSetup) -> None:
    assert isinstance(asynclock.connect(cluster.url).backend, ClusterBackend)
    client = aioredis.RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    assert isinstance(asynclock.connect(client).backend, ClusterBackend)
    with pytest.raises(ValueError, match="host:port"):
        asynclock.connect("redis+cluster://nohost")


async def test_renewals_are_one_script_call_per_slot(harness: ClusterHarness, cluster: ClusterSetup) -> None:
    locks = harness.connect(ttl=scaled(30))
    backend = cluster_backend(locks)
    names = [f"slot-{i}" for i in range(12)]
    leases = [await locks.lock(name).acquire() for name in names]
    slots = {backend.cluster.keyslot(backend.lock_key(LockRef("lock", name))) for name in names}
    assert len(slots) > 3, "the names should spread over several slots (and nodes)"
    items = [RenewItem(LockRef("lock", lease.name), insides.hold_of(lease), scaled(30)) for lease in leases]
    assert await backend.renew(items) == [True] * len(items)  # loads the script on every node
    before = await script_calls(cluster)
    assert await backend.renew(items) == [True] * len(items)
    assert await script_calls(cluster) - before == len(slots)
    # not the holder any more in one slot: only that item says so
    await harness.expire(names[0])
    assert await backend.renew(items) == [False] + [True] * (len(items) - 1)


async def test_a_waiter_is_woken_by_a_sharded_release(harness: ClusterHarness) -> None:
    holder = harness.connect(ttl=scaled(20))
    waiter = harness.connect(ttl=scaled(20))
    order: list[str] = []
    await holder.lock("wake").acquire()

    async def wait_for_it() -> None:
        async with waiter.lock("wake"):
            order.append("waiter got it")

    task = asyncio.create_task(wait_for_it())
    await asyncio.sleep(0.2)
    assert not task.done()
    order.append("released")
    await holder.lock("wake").release()
    await asyncio.wait_for(task, scaled(5))  # far sooner than the holder's 20 s lease
    assert order == ["released", "waiter got it"]


async def test_a_slot_that_moves_during_a_hold(harness: ClusterHarness, cluster: ClusterSetup) -> None:
    holder = harness.connect(ttl=scaled(20))
    waiter = harness.connect(ttl=scaled(20))
    lease = await holder.lock("moving").acquire()
    backend = cluster_backend(holder)
    slot = backend.cluster.keyslot(backend.lock_key(LockRef("lock", "moving")))
    channel = backend.channel("moving")
    order: list[str] = []

    async def wait_for_it() -> None:
        async with waiter.lock("moving"):
            order.append("waiter got it")

    task = asyncio.create_task(wait_for_it())
    await asyncio.sleep(0.2)
    source = cluster.owner_of(slot)
    target = next(server for server in cluster.servers if server is not source)
    await asyncio.to_thread(cluster.move_slot, slot, target)
    assert cluster.owner_of(slot) is target
    # the renewal meets MOVED and follows the slot; the hold moved with it
    assert await backend.renew([RenewItem(LockRef("lock", "moving"), insides.hold_of(lease), scaled(20))]) == [True]
    new_node = aioredis.Redis(host="127.0.0.1", port=target.port)
    try:
        assert await new_node.exists(backend.lock_key(LockRef("lock", "moving"))) == 1
        # the waiter's client was unsubscribed by the old node and subscribed on the new one
        async with asyncio.timeout(scaled(10)):
            while channel.encode() not in await shard_channels(new_node):
                await asyncio.sleep(0.02)
    finally:
        await new_node.aclose()
    shards = cluster_backend(waiter).shards
    assert shards is not None and shards.moves >= 1
    assert not task.done() and not lease.lost
    order.append("released")
    await holder.lock("moving").release()
    await asyncio.wait_for(task, scaled(5))  # woken by SPUBLISH on the new node, not by the 20 s lease
    assert order == ["released", "waiter got it"]


class Leading:
    """A candidate of ``election`` in a task of its own: leads until told to resign."""

    def __init__(self, election: asynclock.Election) -> None:
        self.led = asyncio.Event()
        self.go = asyncio.Event()
        self.token: int | None = None
        self.task = asyncio.create_task(self._run(election))

    async def _run(self, election: asynclock.Election) -> None:
        async with election.leadership() as term:
            self.token = term.token
            self.led.set()
            await self.go.wait()
            await election.resign()

    async def leads(self, within: float) -> int:
        async with asyncio.timeout(within):
            await self.led.wait()
        assert self.token is not None
        return self.token


async def subscribed_on(node: aioredis.Redis, channel: str, within: float = scaled(10)) -> None:
    """Wait (a test's bounded look) until ``node`` has a subscriber of the shard channel ``channel``."""
    async with asyncio.timeout(within):
        while channel.encode() not in await shard_channels(node):
            await asyncio.sleep(0.02)


async def test_an_election_hands_over_on_a_shard_channel_in_its_slot(
    harness: ClusterHarness, cluster: ClusterSetup
) -> None:
    """The waiting candidate's client listens on its hand-over channel of that election, a shard
    channel in the election's slot, on the slot's node; a resign reaches it there at once (its
    30 s ttl would make a poll come 10 s later)."""
    first, second = harness.connect(ttl=30), harness.connect(ttl=30)
    backend = cluster_backend(second)
    key = backend.lock_key(LockRef("election", "sched"))
    channel = backend.handover_channel("sched")
    assert backend.cluster.keyslot(channel) == backend.cluster.keyslot(key)
    leader = Leading(first.election("sched", identity="first"))
    token = await leader.leads(scaled(5))
    waiting = Leading(second.election("sched", identity="second"))
    node = aioredis.Redis(host="127.0.0.1", port=cluster.owner_of(backend.cluster.keyslot(key)).port)
    try:
        await subscribed_on(node, channel)
        async with asyncio.timeout(scaled(5)):  # (subscribed first, then in line)
            while (await first.election("sched").info()).waiters != 1:
                await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        resigned = loop.time()
        leader.go.set()
        assert await waiting.leads(scaled(2)) > token
        assert loop.time() - resigned < scaled(2)
        await leader.task
        seen = await first.election("sched").leader()
        assert seen is not None and seen.identity == "second"
        waiting.go.set()
        await waiting.task
    finally:
        await node.aclose()


async def test_an_election_whose_slot_moves_keeps_its_line_hand_overs_and_observers(
    harness: ClusterHarness, cluster: ClusterSetup
) -> None:
    """A live migration of the election's slot: the leader's hold and the line move with it,
    the waiting candidate's hand-over channel and the observer's channel are subscribed again
    on the new node, and the resign after the move reaches both at once."""
    first, second, watcher = harness.connect(ttl=30), harness.connect(ttl=30), harness.connect(ttl=30)
    backend = cluster_backend(second)
    key = backend.lock_key(LockRef("election", "moving"))
    slot = backend.cluster.keyslot(key)
    changes = watcher.election("moving").observe()
    assert await anext(changes) is None
    leader = Leading(first.election("moving", identity="first"))
    await leader.leads(scaled(5))
    seen = await asyncio.wait_for(anext(changes), scaled(5))
    assert seen is not None and seen.identity == "first"
    waiting = Leading(second.election("moving", identity="second"))
    source = cluster.owner_of(slot)
    old_node = aioredis.Redis(host="127.0.0.1", port=source.port)
    try:
        await subscribed_on(old_node, backend.handover_channel("moving"))
        async with asyncio.timeout(scaled(5)):  # (subscribed first, then in line)
            while (await watcher.election("moving").info()).waiters != 1:
                await asyncio.sleep(0.02)
    finally:
        await old_node.aclose()
    target = next(server for server in cluster.servers if server is not source)
    await asyncio.to_thread(cluster.move_slot, slot, target)
    new_node = aioredis.Redis(host="127.0.0.1", port=target.port)
    try:
        assert await new_node.exists(key, key + ":q") == 2, "the hold and the line moved with the slot"
        await subscribed_on(new_node, backend.handover_channel("moving"))
        await subscribed_on(new_node, key)  # the observer's
    finally:
        await new_node.aclose()
    assert not waiting.led.is_set()
    loop = asyncio.get_running_loop()
    resigned = loop.time()
    leader.go.set()
    await waiting.leads(scaled(2))  # by SPUBLISH on the new node, not by a poll 10 s later
    assert loop.time() - resigned < scaled(2)
    async with asyncio.timeout(scaled(5)):
        while (seen := await anext(changes)) is None or seen.identity != "second":
            pass
    waiting.go.set()
    await asyncio.gather(leader.task, waiting.task)
    await changes.aclose()  # type: ignore[attr-defined]


async def test_a_silently_dead_shard_connection_is_replaced_and_releases_arrive_again(
    harness: ClusterHarness, cluster: ClusterSetup
) -> None:
    """The waiter's sharded pub/sub connection is black-holed (no FIN): its
    health check notices within ttl/3, the channel is subscribed again, and
    the next release reaches the waiter as a message, long before the
    holder's lease (its fallback) would have run out."""
    loop = asyncio.get_running_loop()
    ttl = scaled(3.0)
    holder = harness.connect(ttl=ttl)
    backend = cluster_backend(holder)
    name = "blackholed"
    node = cluster.owner_of(backend.cluster.keyslot(backend.lock_key(LockRef("lock", name))))
    channel = backend.channel(name).encode()
    admin = aioredis.Redis(host="127.0.0.1", port=node.port)

    async def subscribers(at_least: int, within: float) -> None:
        async with asyncio.timeout(within):
            while True:
                answer = await admin.execute_command("PUBSUB", "SHARDNUMSUB", channel)  # type: ignore[no-untyped-call]
                if int(answer[1]) >= at_least:
                    return
                await asyncio.sleep(0.01)

    with TcpProxy("127.0.0.1", node.port) as proxy:
        # the waiter reaches the lock's node through the proxy (redis-py's address_remap)
        def through_proxy(address: tuple[str, int]) -> tuple[str, int]:
            return ("127.0.0.1", proxy.port) if address[1] == node.port else address

        others = [f"127.0.0.1:{server.port}" for server in cluster.servers if server is not node]
        waiter = asynclock.connect(
            f"redis+cluster://127.0.0.1:{proxy.port},{','.join(others)}",
            ttl=ttl,
            prefix=harness.prefix,
            address_remap=through_proxy,
        )
        # Mapped before the first request: a redirect (MOVED) to a fresh client
        # would name the node's own address, which redis-py does not remap.
        await cluster_backend(waiter).cluster.initialize()
        await holder.lock(name).acquire()
        got = asyncio.Event()

        async def wait_for_it() -> None:
            async with waiter.lock(name):
                got.set()

        task = asyncio.create_task(wait_for_it())
        try:
            await subscribers(1, scaled(5))
            shards = cluster_backend(waiter).shards
            assert shards is not None
            shard = shard_of(shards, channel)
            arrived: list[bytes] = []
            real = shards.message
            shards.message = lambda channel, payload: (arrived.append(channel), real(channel, payload))[1]  # type: ignore[method-assign]
            proxy.blackhole_client(listener_port(shard))
            silenced = loop.time()
            # the dead connection stays subscribed on the server; a new one joins it
            await subscribers(2, ttl)
            assert loop.time() - silenced <= ttl / 3 + scaled(0.5)
            await holder.lock(name).release()
            released = loop.time()
            await eventually(lambda: channel in arrived, ttl / 4, "the release message to arrive")
            await asyncio.wait_for(got.wait(), scaled(5))
            assert loop.time() - released < ttl / 4
            await asyncio.wait_for(task, scaled(5))
        finally:
            task.cancel()
            await waiter.aclose()
            await admin.aclose()


async def test_a_refusal_by_the_cluster_is_a_configuration_error(
    cluster: ClusterSetup, caplog: pytest.LogCaptureFixture
) -> None:
    """Wrong credentials, or an ACL user without the right to run scripts:
    raised at once by an acquire that would wait for ever, naming the
    cluster's nodes, quoting the server, and never showing the password."""
    caplog.set_level(logging.DEBUG, logger="asynclock")
    right, wrong = "r1ght-Pa55w0rd", "wr0ng-Pa55w0rd"
    for server in cluster.servers:
        admin = aioredis.Redis(host="127.0.0.1", port=server.port)
        try:
            rules = ["reset", "on", f">{right}", "~*", "&*", "+@all", "-@scripting"]
            await admin.execute_command("ACL", "SETUSER", "noscript", *rules)  # type: ignore[no-untyped-call]
        finally:
            await admin.aclose()
    for user, password, words in [
        ("locker", wrong, "invalid username-password"),
        ("noscript", right, "no permissions"),
    ]:
        url = cluster.url.replace("redis+cluster://", f"redis+cluster://{user}:{password}@")
        with pytest.raises(ConfigurationError):
            async with asyncio.timeout(scaled(3)), asynclock.connect(url):
                pass  # entering makes a round trip, which meets the refusal
        async with contextlib.AsyncExitStack() as stack:
            locks = asynclock.connect(url)  # used without being opened: its first acquire meets it
            stack.push_async_callback(locks.aclose)
            with pytest.raises(ConfigurationError) as caught:
                async with asyncio.timeout(scaled(3)):  # not retried for a ttl (30 s)
                    await locks.lock("refused").acquire()
            # a candidate too, whose client subscribes to its hand-over channel first
            with pytest.raises(ConfigurationError) as refused:
                async with asyncio.timeout(scaled(3)):
                    async with locks.election("refused").leadership():
                        pass
            assert handovers_listening(locks) == [], "the refused candidate's subscription is let go"
        text = str(caught.value)
        assert f"127.0.0.1:{cluster.servers[0].port}" in text and words in text, text
        assert password not in text and password not in str(refused.value)
        assert all(password not in record.getMessage() for record in caplog.records)


@pytest.fixture
def own_cluster() -> Iterator[ClusterSetup]:
    """A cluster of this test's own: it kills a node."""
    setup = ClusterSetup(3)
    try:
        setup.start()
        yield setup
    finally:
        setup.cleanup()


async def test_a_dead_primary_costs_only_the_locks_in_its_slots(own_cluster: ClusterSetup) -> None:
    ttl = scaled(2)
    async with (
        asynclock.connect(own_cluster.url, ttl=ttl, prefix="dead") as holder,
        asynclock.connect(own_cluster.url, ttl=ttl, prefix="dead") as other,
    ):
        backend = cluster_backend(holder)
        victim = own_cluster.servers[0]
        names = [f"n{i}" for i in range(40)]
        owners = {
            name: own_cluster.owner_of(backend.cluster.keyslot(backend.lock_key(LockRef("lock", name))))
            for name in names
        }
        doomed = next(name for name in names if owners[name] is victim)
        spared = next(name for name in names if owners[name] is not victim)
        lease = await holder.lock(doomed).acquire()
        kept = await holder.lock(spared).acquire()
        # an election lives in its name's slot too: a leader on the dead node loses its term
        lost_leader = Leading(holder.election(doomed, identity="doomed"))
        kept_leader = Leading(holder.election(spared, identity="spared"))
        await lost_leader.leads(scaled(5))
        await kept_leader.leads(scaled(5))
        victim.kill()
        # its renewals cannot reach the slot's node: lost by the trusted deadline, never kept
        await asyncio.wait_for(lease.wait_lost(), scaled(10))
        with pytest.raises(asynclock.LockLost):
            await asyncio.wait_for(lost_leader.task, scaled(10))
        with pytest.raises(BackendUnavailable):
            async with asyncio.timeout(scaled(20)):  # nothing hangs
                await other.lock(doomed).acquire(timeout=ttl)
        # the other nodes' slots go on: renewed, exclusive, and free once released
        await asyncio.sleep(ttl)
        assert not kept.lost and not kept_leader.task.done()
        seen = await other.election(spared).leader()
        assert seen is not None and seen.identity == "spared"
        kept_leader.go.set()
        await kept_leader.task
        with pytest.raises(LockTimeout):
            await other.lock(spared).acquire(timeout=0)
        await holder.lock(spared).release()
        async with other.lock(spared):
            pass


async def test_a_paused_primary_stalls_nobody_past_their_bounds(own_cluster: ClusterSetup) -> None:
    ttl = scaled(2)
    async with (
        asynclock.connect(own_cluster.url, ttl=ttl, prefix="paused") as holder,
        # (a longer ttl: redis-py's Cluster client re-reads the topology after a
        # timeout, from the paused node too, and a loaded machine can keep the
        # healthy node's lock behind that for a short ttl's worth of retries)
        asynclock.connect(own_cluster.url, ttl=3 * ttl, prefix="paused") as other,
    ):
        backend = cluster_backend(holder)
        frozen = own_cluster.servers[1]
        names = [f"p{i}" for i in range(40)]
        owners = {
            name: own_cluster.owner_of(backend.cluster.keyslot(backend.lock_key(LockRef("lock", name))))
            for name in names
        }
        stuck = next(name for name in names if owners[name] is frozen)
        free = next(name for name in names if owners[name] is not frozen)
        lease = await holder.lock(stuck).acquire()
        frozen.pause()
        try:
            # a waiter on the stalled node gives up within its own bounds
            with pytest.raises((BackendUnavailable, LockTimeout)):
                async with asyncio.timeout(scaled(20)):
                    await other.lock(stuck).acquire(timeout=ttl / 2)
            # the holder cannot renew there: lost by its trusted deadline, not kept
            await asyncio.wait_for(lease.wait_lost(), scaled(10))
            async with other.lock(free):
                pass
        finally:
            frozen.resume()
