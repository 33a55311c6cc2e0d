"""Defects found in review of the ZooKeeper and PostgreSQL backends, each pinned by a test.

Real servers only (the session fixtures of ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

import asynclock
from asynclock import BackendUnavailable, LockTimeout
from tests.harness_postgres import PostgresHarness
from tests.harness_zookeeper import ZooKeeperHarness
from tests.servers import scaled
from tests.servers.postgres import PostgresServer
from tests.servers.proxy import TcpProxy
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = scaled(10)) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


@pytest.fixture
async def zk(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zookeeper_server)
    async with harness:
        yield harness


@pytest.fixture
def zk_proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", zookeeper_server.port) as tcp:
        yield tcp


async def test_pg_lock_timeout_after_the_grant_gives_the_advisory_lock_back(pg: PostgresHarness) -> None:
    """``lock_timeout`` can end the acquire statement *after* the advisory lock was granted.

    The statement takes the lock first and then upserts the fence counter; if
    that row is locked (an application's ``SELECT ... FOR UPDATE`` on the
    table, a client with another prefix sharing the table), the row-lock wait
    hits ``lock_timeout``. The session-level advisory lock survives the
    statement's error, so it must be unlocked before the connection goes back
    to the pool, or the name stays locked for as long as that pooled
    connection lives.
    """
    locks = pg.connect(ttl=TTL)
    other = pg.connect(ttl=TTL)
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


async def test_zk_a_queued_wait_that_loses_the_server_ends_unavailable_and_its_node_goes_later(
    zk: ZooKeeperHarness, zk_proxy: TcpProxy
) -> None:
    """A waiter whose node is queued, cut off from the server, ends with BackendUnavailable at its timeout.

    Leaving the queue while disconnected cannot delete the node now; that is
    the background clean-up's job once the connection is back. Waiting for it
    (up to a session timeout) made the acquire overrun its timeout until the
    front's outer bound cut it, which then reported a plain LockTimeout.
    """
    holder = zk.connect(ttl=scaled(2))
    waiter = asynclock.connect(f"zk://127.0.0.1:{zk_proxy.port}", ttl=scaled(6), prefix=zk.prefix)
    async with waiter:
        await holder.lock("gone").acquire()
        key = holder.lock("gone").key
        admin = await zk.admin()
        task = asyncio.create_task(waiter.lock("gone").acquire(timeout=scaled(1)))

        async def queued() -> bool:
            return len(await admin.contenders(key)) == 2

        await until(queued, "the waiter's node queued")
        zk_proxy.refuse(True)
        zk_proxy.reset()
        with pytest.raises(BackendUnavailable):
            await asyncio.wait_for(task, scaled(10))
        zk_proxy.refuse(False)

        async def cleaned() -> bool:
            return len(await admin.contenders(key)) == 1

        # the node is deleted once the (still live) session is connected again
        await until(cleaned, "the waiter's node deleted after the reconnect")
        await holder.lock("gone").release()
