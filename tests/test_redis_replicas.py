"""``replicas=N``: acquires (and renewals) confirmed by N replicas through
WAIT, on a real primary and replica."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, LockTimeout
from tests.servers import RedisServer, scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer(extra=["--repl-diskless-sync-delay", "0"])
    primary.start()
    replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    replica.start()
    try:
        _wait_for_link(replica, primary)
        yield primary, replica
    finally:
        replica.cleanup()
        primary.cleanup()


def _wait_for_link(replica: RedisServer, primary: RedisServer) -> None:
    """Until the replica is linked, and the primary counts it for WAIT.

    (The replica says the link is up before the primary counts it: that takes
    the replica's first acknowledgement, up to a second later.)
    """
    import time

    import redis

    deadline = time.monotonic() + 20
    client = redis.Redis(port=replica.port)
    try:
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, replica.log()
            time.sleep(0.02)
    finally:
        client.close()
    admin = redis.Redis(port=primary.port)
    try:
        while True:
            admin.set("link-check", 1)
            if admin.execute_command("WAIT", 1, 100) >= 1:
                break
            assert time.monotonic() < deadline, "the primary never counted the replica for WAIT"
        admin.delete("link-check")
    finally:
        admin.close()


async def test_an_acquire_confirmed_by_a_replica_survives_promoting_it(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    locks = asynclock.connect(f"{primary.url}?replicas=1&replica_timeout=2", ttl=scaled(30))
    lease = await locks.lock("failover").acquire()
    # the primary dies right after the acquire returned; the replica is promoted
    primary.kill()
    promoted = aioredis.Redis.from_url(replica.url)
    await promoted.replicaof("NO", "ONE")
    assert b" " in (await promoted.get("asynclock:{failover}:x") or b"")  # the plain lock, held
    async with asynclock.connect(replica.url, ttl=TTL) as after:
        with pytest.raises(LockTimeout):
            await after.lock("failover").acquire(timeout=0)  # still held there
        info = await after.lock("failover").info()
        assert info.owner is not None and info.owner.startswith(locks.client_id)
        assert info.token == lease.token
    await promoted.aclose()
    await locks.aclose()


async def test_an_acquire_no_replica_confirms_is_rolled_back(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    admin = aioredis.Redis.from_url(primary.url)
    replica.pause()
    try:
        async with asynclock.connect(primary.url, ttl=TTL, replicas=1, replica_timeout=0.1) as locks:
            with pytest.raises(BackendUnavailable):
                await locks.lock("unsafe").acquire(timeout=0.5)
            # (a released lock keeps only its last fencing token)
            left = await admin.get("asynclock:{unsafe}:x")
            assert left is None or b" " not in left, "an unconfirmed acquire was left behind"
    finally:
        replica.resume()
        await admin.aclose()


async def test_renewals_a_replica_cannot_confirm_lose_the_lease(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    ttl = scaled(1.0)
    async with asynclock.connect(primary.url, ttl=ttl, replicas=1, replica_timeout=0.1) as locks:
        with pytest.raises(asynclock.LockLost):
            async with locks.lock("renew") as lease:
                replica.pause()
                try:
                    await asyncio.sleep(scaled(10))
                finally:
                    replica.resume()
        assert lease.lost
        # lost because the replica did not confirm (the control test below
        # shows the same pause without the option costs nothing)
        assert "replica" in (lease.lost_reason or ""), lease.lost_reason


async def test_without_the_option_nothing_waits(primary_and_replica: tuple[RedisServer, RedisServer]) -> None:
    primary, replica = primary_and_replica
    replica.pause()
    try:
        async with asynclock.connect(primary.url, ttl=TTL) as locks:
            async with locks.lock("plain") as lease:
                await asyncio.sleep(TTL * 2)  # renewals need no replica without the option
                assert not lease.lost
    finally:
        replica.resume()


@pytest.mark.parametrize(
    "url_or_options",
    [{"replicas": -1}, {"replicas": 1.5}, {"replica_timeout": 0}, {"replica_timeout": "soon"}, "?replicas=x"],
)
def test_bad_replica_options_are_refused_before_any_io(url_or_options: object) -> None:
    with pytest.raises(ValueError):
        if isinstance(url_or_options, str):
            asynclock.connect("redis://127.0.0.1:1/0" + url_or_options)
        else:
            assert isinstance(url_or_options, dict)
            asynclock.connect("redis://127.0.0.1:1/0", **url_or_options)


async def test_a_demoted_primary_answering_readonly_is_a_loss_not_a_retry(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    loop = asyncio.get_running_loop()
    ttl = scaled(3.0)
    async with asynclock.connect(primary.url, ttl=ttl) as locks:
        with pytest.raises(asynclock.LockLost):
            async with locks.lock("demoted") as lease:
                new_primary = aioredis.Redis.from_url(replica.url)
                old_primary = aioredis.Redis.from_url(primary.url)
                await new_primary.replicaof("NO", "ONE")
                await old_primary.replicaof("127.0.0.1", replica.port)  # demoted: writes answer READONLY
                demoted_at = loop.time()
                try:
                    await asyncio.sleep(ttl * 2)
                finally:
                    await new_primary.aclose()
                    await old_primary.aclose()
        assert "no longer has this hold" in (lease.lost_reason or ""), lease.lost_reason
        # at the next renewal (ttl/3), not after retrying until the deadline
        assert loop.time() - demoted_at < ttl * 0.9


async def test_a_term_handed_over_is_confirmed_by_a_replica_before_it_begins(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """Elections with ``replicas=1``: the next candidate, handed leadership by a resign,
    confirms it with a request of its own and WAIT before its term begins, so the replica
    has the new leader, identity and token, as soon as ``leadership()`` returns."""
    primary, replica = primary_and_replica
    url = f"{primary.url}?replicas=1&replica_timeout=2"
    async with asynclock.connect(url, ttl=scaled(5)) as a, asynclock.connect(url, ttl=scaled(5)) as b:
        first = a.election("e", identity="a")
        on_replica: list[bytes | None] = []
        replica_admin = aioredis.Redis.from_url(replica.url)

        async def follow() -> int | None:
            async with b.election("e", identity="b").leadership() as term:
                on_replica.append(await replica_admin.get("asynclock:{e}:e"))
                return term.token

        async with first.leadership():
            waiting = asyncio.create_task(follow())
            async with asyncio.timeout(scaled(5)):
                while (await first.info()).waiters != 1:
                    await asyncio.sleep(0.01)
            await first.resign()
        token = await asyncio.wait_for(waiting, scaled(5))
        assert on_replica[0] is not None and on_replica[0].startswith(f"{token} 1 ".encode())
        assert on_replica[0].endswith(b"/b")
        await replica_admin.aclose()
