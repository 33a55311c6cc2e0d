"""Redlock-only tests: five real redis-servers, some killed, paused or restarted empty.

The contract suite runs on Redlock too (``tests/harnesses/redlock.py``); these
tests cover what only a quorum of independent nodes has: a minority can fail
without anyone noticing, a majority cannot, and a node that comes back empty
too soon can let a second holder in.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.abc import LockRef, RenewItem
from asynclock.backends.redlock import RedlockBackend, quorum
from tests.harnesses import eventually, insides, listener_port
from tests.harnesses.redlock import RedlockHarness, redlock_backend, spy_releases
from tests.servers import scaled
from tests.servers.proxy import TcpProxy
from tests.servers.redis_topologies import RedisNodes

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
def nodes() -> Iterator[RedisNodes]:
    """Five redis-servers of this test's own: it may kill, pause or restart them."""
    group = RedisNodes(5)
    try:
        group.start()
        yield group
    finally:
        group.cleanup()


@pytest.fixture
async def harness(nodes: RedisNodes) -> AsyncIterator[RedlockHarness]:
    h = RedlockHarness(nodes)
    async with h:
        yield h


async def restart_empty(nodes: RedisNodes, index: int, *, after: float = 0.0) -> None:
    """Crash node ``index`` now; start it again with no data ``after`` seconds later.

    ``after`` is the delayed-restart setting: an operator who restarts a
    crashed Redlock node only after the longest lock ttl keeps exclusion;
    restarting at once can break it (see the tests below).
    """
    nodes[index].kill()
    await asyncio.sleep(after)
    await asyncio.to_thread(nodes[index].restart_empty)


async def exclusive_rounds(clients: list[asynclock.Locks], name: str, rounds: int) -> int:
    """Every client takes ``name`` ``rounds`` times; fails if two ever hold it at once."""
    inside = 0
    entered = 0

    async def worker(locks: asynclock.Locks) -> None:
        nonlocal inside, entered
        for _ in range(rounds):
            async with locks.lock(name):
                inside += 1
                entered += 1
                assert inside == 1, "two holders at once"
                await asyncio.sleep(0.005)
                inside -= 1

    async with asyncio.timeout(scaled(30)):
        await asyncio.gather(*(worker(locks) for locks in clients))
    return entered


def test_quorum_is_a_majority() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 2, 3, 3, 4, 4]


def test_url_names_every_node_and_takes_a_node_timeout() -> None:
    locks = asynclock.connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/2?node_timeout=0.25&ttl=4")
    backend = locks.backend
    assert isinstance(backend, RedlockBackend)
    assert len(backend.nodes) == 3 and backend.quorum == 2
    assert backend.node_timeout(30) == 0.25 and locks.ttl == 4
    kwargs = [node.connection.client.connection_pool.connection_kwargs for node in backend.nodes]
    assert [(kw["port"], kw["db"]) for kw in kwargs] == [(1, 2), (2, 2), (3, 2)]
    with pytest.raises(ValueError, match="names its nodes"):
        asynclock.connect("redlock:///0")
    with pytest.raises(ValueError, match="node_timeout"):
        asynclock.connect("redlock://127.0.0.1:1?node_timeout=soon")


async def test_the_hold_is_on_every_node_and_the_lease_has_no_token(harness: RedlockHarness) -> None:
    locks = harness.connect(ttl=TTL)
    async with locks.lock("everywhere") as lease:
        assert lease.token is None
        for admin in harness.admins:
            owner = await admin.hget(f"{harness.prefix}:{{everywhere}}", "owner")
            assert isinstance(owner, bytes) and owner.decode().startswith(locks.client_id)
    assert await harness.leftovers() == []


async def test_two_dead_nodes_of_five_change_nothing(harness: RedlockHarness, nodes: RedisNodes) -> None:
    nodes[0].kill()
    nodes[3].kill()
    clients = [harness.connect(ttl=TTL) for _ in range(3)]
    assert await exclusive_rounds(clients, "two-dead", 4) == 12
    # a holder keeps its lease through several renewals on the three survivors
    async with clients[0].lock("long") as lease:
        first = lease.expires_at
        await asyncio.sleep(TTL * 2)
        assert not lease.lost and lease.expires_at > first
        with pytest.raises(LockTimeout):
            await clients[1].lock("long").acquire(timeout=0)


async def test_three_dead_nodes_fail_acquires_in_time_and_cost_the_holder_its_lease(
    harness: RedlockHarness, nodes: RedisNodes
) -> None:
    holder = harness.connect(ttl=TTL)
    other = harness.connect(ttl=TTL)
    with pytest.raises(LockLost):
        async with holder.lock("majority") as lease:
            for index in (0, 1, 2):
                nodes[index].kill()
            await asyncio.sleep(scaled(10))  # cancelled when no majority renews it
    assert lease.lost
    for timeout in (0, TTL):
        with pytest.raises((LockTimeout, BackendUnavailable)):
            async with asyncio.timeout(scaled(10)):  # nothing hangs
                await other.lock("majority").acquire(timeout=timeout)
    with pytest.raises(BackendUnavailable):
        async with asyncio.timeout(scaled(10)):
            await other.lock("fresh").acquire(timeout=TTL)


async def test_a_paused_minority_slows_nobody_down_for_long(harness: RedlockHarness, nodes: RedisNodes) -> None:
    nodes[1].pause()
    nodes[4].pause()
    try:
        clients = [harness.connect(ttl=TTL) for _ in range(3)]
        assert await exclusive_rounds(clients, "paused", 3) == 9
        async with clients[0].lock("held") as lease:
            await asyncio.sleep(TTL * 2)
            assert not lease.lost
            with pytest.raises(LockTimeout):
                await clients[2].lock("held").acquire(timeout=0)
    finally:
        nodes[1].resume()
        nodes[4].resume()


@pytest.mark.parametrize("dead", [0, 2])
async def test_a_waiter_is_woken_by_the_release_not_by_the_holders_ttl(
    harness: RedlockHarness, nodes: RedisNodes, dead: int
) -> None:
    for index in range(dead):
        nodes[index].kill()  # their listeners keep reconnecting; the others' messages suffice
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
    # far sooner than the holder's 20 s lease: the release message woke it
    await asyncio.wait_for(task, scaled(5))
    assert order == ["released", "waiter got it"]


async def test_contenders_that_split_the_vote_back_off_and_one_wins(harness: RedlockHarness) -> None:
    clients = [harness.connect(ttl=TTL) for _ in range(6)]
    names = ["split"] * 6
    results = await asyncio.gather(
        # detached: the leases outlive the tasks gather runs the acquires in
        *(
            locks.lock(name).acquire(timeout=scaled(1), detached=True)
            for locks, name in zip(clients, names, strict=True)
        ),
        return_exceptions=True,
    )
    # acquired one after another only if the holders release: here nobody
    # releases, so exactly one holds it and the rest time out
    held = [result for result in results if isinstance(result, asynclock.Lease)]
    assert len(held) == 1, results
    assert all(isinstance(result, LockTimeout) for result in results if result not in held)


async def test_an_immediate_empty_restart_can_let_a_second_holder_in(
    harness: RedlockHarness, nodes: RedisNodes
) -> None:
    """The danger the delayed-restart advice avoids, shown deterministically."""
    ttl = scaled(3)
    first = harness.connect(ttl=ttl)
    second = harness.connect(ttl=ttl)
    nodes[3].kill()
    nodes[4].kill()
    lease = await first.lock("restart").acquire()  # held on nodes 0, 1, 2: exactly a majority
    trusted_until = lease.expires_at
    await restart_empty(nodes, 2, after=0.0)  # node 2 forgets the hold at once
    await asyncio.to_thread(nodes[3].restart_empty)
    await asyncio.to_thread(nodes[4].restart_empty)
    taken = await second.lock("restart").acquire(timeout=scaled(2))  # nodes 2, 3, 4
    taken_at = asyncio.get_running_loop().time()
    # the first holder still trusts its lease, and the second holds it too
    assert taken_at < trusted_until
    assert taken.name == lease.name
    # the first holder finds out at its next renewal (a majority says "not yours")
    await asyncio.wait_for(lease.wait_lost(), scaled(5))
    await second.lock("restart").release()
    await first.aclose()


async def test_a_restart_delayed_past_the_ttl_keeps_exclusion(harness: RedlockHarness, nodes: RedisNodes) -> None:
    ttl = scaled(1.0)
    first = harness.connect(ttl=ttl)
    second = harness.connect(ttl=ttl)
    nodes[3].kill()
    nodes[4].kill()
    loop = asyncio.get_running_loop()
    lease = await first.lock("restart").acquire()  # held on nodes 0, 1, 2
    lost_at: list[float] = []

    async def watch() -> None:
        await lease.wait_lost()
        lost_at.append(loop.time())

    watcher = asyncio.create_task(watch())
    # node 2 crashes and comes back empty only after the longest ttl in use
    restarts = asyncio.create_task(restart_empty(nodes, 2, after=ttl * 1.5))
    taken: list[float] = []

    async def contend() -> None:
        while not restarts.done():
            try:
                await second.lock("restart").acquire(timeout=0)
            except (LockTimeout, BackendUnavailable):
                await asyncio.sleep(0.02)
                continue
            taken.append(loop.time())
            return

    async with asyncio.timeout(scaled(15)):
        await contend()  # in this task: it owns what it acquires
    await restarts
    await asyncio.to_thread(nodes[3].restart_empty)
    await asyncio.to_thread(nodes[4].restart_empty)
    if not taken:
        await second.lock("restart").acquire(timeout=scaled(5))
        taken.append(loop.time())
    await asyncio.wait_for(watcher, scaled(5))
    # the first holder had given up (its majority was gone) before the second got it
    assert lost_at[0] <= taken[0]
    await second.lock("restart").release()


async def test_renewal_needs_a_majority_of_yes(harness: RedlockHarness, nodes: RedisNodes) -> None:
    locks = harness.connect(ttl=TTL)
    lease = await locks.lock("renew").acquire()
    backend = redlock_backend(locks)
    item = RenewItem(LockRef("lock", "renew"), insides.hold_of(lease), TTL)
    assert await backend.renew([item]) == [True]
    # two nodes lose the key: three of five still renew it
    for admin in harness.admins[:2]:
        await admin.delete(f"{harness.prefix}:{{renew}}")
    assert await backend.renew([item]) == [True]
    # a third loses it: a majority says "not yours"
    await harness.admins[2].delete(f"{harness.prefix}:{{renew}}")
    assert await backend.renew([item]) == [False]
    await asyncio.wait_for(lease.wait_lost(), scaled(5))
    # two unreachable and two "not yours": undecided, an error the watchdog retries
    lease = await locks.lock("renew2").acquire()
    item = RenewItem(LockRef("lock", "renew2"), insides.hold_of(lease), TTL)
    nodes[0].kill()
    nodes[1].kill()
    for admin in harness.admins[2:4]:
        await admin.delete(f"{harness.prefix}:{{renew2}}")
    [answer] = await backend.renew([item])
    assert isinstance(answer, BackendUnavailable)
    await asyncio.wait_for(lease.wait_lost(), scaled(5))


async def test_silently_dead_listener_connections_are_replaced_and_releases_arrive_again(
    redlock_nodes: RedisNodes,
) -> None:
    """Every node's pub/sub connection of the waiter is black-holed (no FIN):
    each one's health check notices within ttl/3, the listeners subscribe
    again, and the next release reaches the waiter as a message, long before
    the holder's lease (its fallback) would have run out."""
    loop = asyncio.get_running_loop()
    ttl = scaled(3.0)
    servers = redlock_nodes.servers[:3]
    prefix = f"bh{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(TcpProxy("127.0.0.1", server.port)) for server in servers]
        direct = ",".join(f"127.0.0.1:{server.port}" for server in servers)
        proxied = ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies)
        admins = [aioredis.Redis.from_url(server.url) for server in servers]
        async with (
            asynclock.connect(f"redlock://{direct}", ttl=ttl, prefix=prefix) as holder,
            asynclock.connect(f"redlock://{proxied}", ttl=ttl, prefix=prefix) as waiter,
        ):
            await holder.lock("bh").acquire()
            got = asyncio.Event()

            async def wait_for_it() -> None:
                async with waiter.lock("bh"):
                    got.set()

            task = asyncio.create_task(wait_for_it())
            backend = redlock_backend(waiter)
            channel = backend.nodes[0].channel("bh")

            async def subscribed(count: int) -> None:
                async with asyncio.timeout(ttl):
                    while True:
                        answers = [await admin.pubsub_numsub(channel) for admin in admins]
                        if all(answer[0][1] >= count for answer in answers):
                            return
                        await asyncio.sleep(0.01)

            await subscribed(1)
            listeners = backend.listeners
            arrived: list[bytes] = []
            spy_releases(backend, lambda name, hold: arrived.append(hold))
            before = [listener.reconnects for listener in listeners]
            for listener, proxy in zip(listeners, proxies, strict=True):
                proxy.blackhole_client(listener_port(listener))
            silenced = loop.time()
            await eventually(
                lambda: all(listener.reconnects > count for listener, count in zip(listeners, before, strict=True)),
                ttl,
                "every listener to notice its dead connection",
            )
            assert loop.time() - silenced <= ttl / 3 + scaled(0.5)
            await subscribed(2)  # (the dead connections are still subscribed on the servers)
            await holder.lock("bh").release()
            released = loop.time()
            await eventually(lambda: bool(arrived), ttl / 4, "the release messages to arrive")
            await asyncio.wait_for(got.wait(), scaled(5))
            assert loop.time() - released < ttl / 4
            await asyncio.wait_for(task, scaled(5))
        for admin in admins:
            await admin.aclose()
