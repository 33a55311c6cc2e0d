"""Private names of client libraries that asynclock relies on: still there in the installed version.

A backend that reads a client's private attribute names it in one constant;
each test here checks that very constant against a real connection, so an
upgrade of the client that drops or renames one fails here, loudly, naming
the attribute and the client's version, rather than deep in a request.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio


# -- PostgreSQL (asyncpg) -------------------------------------------------------------------


async def test_asyncpg_private_attributes_are_still_there(postgres_server: PostgresServer) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    from asynclock.backends.postgres._config import ASYNCPG_PRIVATE, pool_address
    from asynclock.backends.postgres._pool import unwrap

    pool = await asyncpg.create_pool(postgres_server.dsn, min_size=0, max_size=1)
    try:
        proxy = await pool.acquire()
        try:
            instances: dict[str, Any] = {"Pool": pool, "PoolConnectionProxy": proxy}
            assert set(ASYNCPG_PRIVATE) <= set(instances), "a class in ASYNCPG_PRIVATE this test does not know"
            for class_name, attributes in ASYNCPG_PRIVATE.items():
                instance = instances[class_name]
                assert type(instance).__name__ == class_name
                for attribute in attributes:
                    if not hasattr(instance, attribute):
                        pytest.fail(
                            f"asyncpg {asyncpg.__version__} has no {class_name}.{attribute} any more:"
                            " asynclock's PostgreSQL backend reads it (see ASYNCPG_PRIVATE)"
                        )
            # and they still mean what the backend takes them for
            conn = unwrap(proxy)
            assert isinstance(conn, asyncpg.Connection), f"asyncpg {asyncpg.__version__}: {type(conn)!r}"
            assert await conn.fetchval("SELECT 1") == 1
            address, _ = pool_address(pool)
            assert str(postgres_server.port) in address, f"asyncpg {asyncpg.__version__}: {address!r}"
        finally:
            await pool.release(proxy)
    finally:
        await pool.close()
