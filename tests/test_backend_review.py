"""Defects found in review of the ZooKeeper and PostgreSQL backends, each pinned by a test.

Real servers only (the session fixtures of ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from asynclock import LockTimeout
from tests.harness_postgres import PostgresHarness
from tests.servers import scaled
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


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
