"""PostgreSQL: mistakes in the configuration say what is wrong, at once, and waiting cannot hide them.

Against real servers: a password refused (a role that logs in with
scram-sha-256), a role or database that does not exist, permission denied on
the fence table, a TLS certificate refused, a server setting the server does
not know; a refused connection, an unresolvable name and a silent listener
within ``connect_timeout``; unknown options before any I/O; and a semaphore
whose clients disagree on the permits.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import asyncpg
import pytest

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockTimeout
from asynclock.backends.postgres import gate_key, permits_key
from tests.harnesses import insides
from tests.harnesses.postgres import HELD_SQL, PostgresHarness, password_role, unsigned
from tests.servers import free_port, scaled
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Longer than anything here may take: a configuration error must come well before it.
PATIENCE = scaled(10)


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


@pytest.fixture
async def role(pg: PostgresHarness) -> AsyncIterator[tuple[str, str]]:
    """A role of this test that logs in with a password: (name, password)."""
    async with password_role(pg) as created:
        yield created


def url_as(pg: PostgresHarness, user: str, password: str | None = None, database: str = "postgres") -> str:
    userinfo = user if password is None else f"{user}:{password}"
    return f"postgresql://{userinfo}@127.0.0.1:{pg.server.port}/{database}"


async def refused(locks: asynclock.Locks, name: str = "x") -> ConfigurationError:
    """The ConfigurationError of an acquire that would wait forever (it must come at once instead)."""
    with pytest.raises(ConfigurationError) as caught:
        await asyncio.wait_for(locks.lock(name).acquire(timeout=None), PATIENCE)
    assert not type(caught.value).__module__.startswith("asyncpg")
    assert caught.value.__cause__ is not None
    return caught.value


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="asynclock"):
        yield caplog


# -- the server refuses this client ----------------------------------------------------------------


async def test_a_refused_password_is_a_configuration_error_that_names_no_password(
    pg: PostgresHarness, role: tuple[str, str], logs: pytest.LogCaptureFixture
) -> None:
    user, password = role
    wrong = f"not-{password}"
    for locks in (
        asynclock.connect(url_as(pg, user, wrong), ttl=TTL),
        asynclock.connect(url_as(pg, user), ttl=TTL, password=wrong),
    ):
        insides.adopt(pg, locks)
        error = await refused(locks)
        text = str(error)
        assert f"127.0.0.1:{pg.server.port}" in text
        assert f'password authentication failed for user "{user}"' in text  # the server's words
        assert wrong not in text and password not in text
        # a second try says the same, at once (nothing was left half started)
        assert str(await refused(locks)) == text
    assert not any(wrong in record.getMessage() for record in logs.records)
    # the right password gets in (so what was refused was the password)
    good = asynclock.connect(url_as(pg, user, password), ttl=TTL, prefix=pg.prefix)
    insides.adopt(pg, good)
    await (await pg.admin()).execute(f"GRANT CREATE ON SCHEMA public TO {user}")
    async with good.lock("x") as lease:
        assert isinstance(lease.token, int)


async def test_a_missing_role_or_database_is_a_configuration_error(pg: PostgresHarness) -> None:
    no_role = asynclock.connect(url_as(pg, f"{pg.prefix}_nobody"), ttl=TTL)
    no_db = asynclock.connect(url_as(pg, pg.server.user, database=f"{pg.prefix}_nowhere"), ttl=TTL)
    insides.adopt(pg, no_role, no_db)
    assert f'role "{pg.prefix}_nobody" does not exist' in str(await refused(no_role))
    error = await refused(no_db)
    assert f'database "{pg.prefix}_nowhere" does not exist' in str(error)
    assert f"127.0.0.1:{pg.server.port}" in str(error)


async def test_permission_denied_on_the_fence_table_is_raised_at_once_and_leaves_nothing(
    pg: PostgresHarness, role: tuple[str, str]
) -> None:
    user, password = role
    # PostgreSQL 15 gives PUBLIC no CREATE on schema public: the table cannot be made.
    limited = asynclock.connect(url_as(pg, user, password), ttl=TTL, prefix=pg.prefix)
    insides.adopt(pg, limited)
    error = await refused(limited)
    assert "permission denied for schema public" in str(error)
    assert f"{pg.prefix}_fence" in str(error)  # the hint names the table
    # The table exists (made by a client that may), and the role may read it but not write it.
    owner = pg.connect(ttl=TTL)
    holder = owner.lock("taken")
    await holder.acquire()
    # (the token sequence it may use: what it may not do is write the fence table)
    await (await pg.admin()).execute(f'GRANT SELECT ON "{pg.prefix}_fence" TO {user}')
    await (await pg.admin()).execute(f'GRANT USAGE, SELECT, UPDATE ON "{pg.prefix}_fence_token" TO {user}')
    # a wait behind a held lock does not hide it: raised at once, nothing queued or held
    error = await refused(limited, "taken")
    assert f"permission denied for table {pg.prefix}_fence" in str(error)
    with pytest.raises(ConfigurationError, match="permission denied"):
        await asyncio.wait_for(limited.semaphore("gpu", permits=2).acquire(timeout=None), PATIENCE)
    assert await pg.granted_to(limited) == []
    assert (await holder.info()).waiters == 0
    await holder.release()


async def test_an_unknown_server_setting_or_a_bad_connection_setting_is_a_configuration_error(
    pg: PostgresHarness,
) -> None:
    # (a name that is no typo of an option goes to the server as a setting, as asyncpg does)
    unknown = asynclock.connect(f"{pg.url}?no_such_setting=1", ttl=TTL, prefix=pg.prefix)
    bad_mode = asynclock.connect(f"{pg.url}?sslmode=sometimes", ttl=TTL, prefix=pg.prefix)
    insides.adopt(pg, unknown, bad_mode)
    assert 'unrecognized configuration parameter "no_such_setting"' in str(await refused(unknown))
    assert "sslmode" in str(await refused(bad_mode))
    # real settings pass
    async with asynclock.connect(
        f"{pg.url}?application_name=app&search_path=public", ttl=TTL, prefix=pg.prefix
    ) as locks:
        async with locks.lock("setting") as lease:
            assert lease.token is not None


@pytest.fixture(scope="module")
def tls_server() -> Iterator[PostgresServer]:
    """A PostgreSQL that speaks TLS with a self-signed certificate (its own: the session's does not)."""
    try:
        server = PostgresServer(tls=True)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    server.start()
    yield server
    server.cleanup()


async def test_a_refused_tls_certificate_is_a_configuration_error(tls_server: PostgresServer) -> None:
    untrusting = asynclock.connect(tls_server.dsn, ttl=TTL, ssl=ssl.create_default_context())
    try:
        error = await refused(untrusting)
        assert "TLS certificate refused" in str(error)
        assert f"127.0.0.1:{tls_server.port}" in str(error)
    finally:
        await untrusting.aclose()
    # trusting its certificate, the same server lets us in over TLS
    trusting = ssl.create_default_context(cafile=str(tls_server.cert_file))
    async with asynclock.connect(tls_server.dsn, ttl=TTL, ssl=trusting) as locks:
        async with locks.lock("tls") as lease:
            assert isinstance(lease.token, int)


# -- the server cannot be reached ------------------------------------------------------------------


async def test_a_refused_connection_or_an_unknown_host_fails_within_connect_timeout() -> None:
    loop = asyncio.get_running_loop()
    port = free_port()
    for url, options, address, cause in (
        (f"postgresql://postgres@127.0.0.1:{port}/postgres", {}, f"127.0.0.1:{port}", "connection refused"),
        (
            "postgresql://postgres@nowhere.invalid:5432/postgres?connect_timeout=2",
            {},
            "nowhere.invalid:5432",
            "name not resolved",
        ),
        (f"postgresql://postgres@127.0.0.1:{port}/postgres", {"connect_timeout": 2}, str(port), "refused"),
    ):
        locks = asynclock.connect(url, ttl=TTL, **options)
        try:
            started = loop.time()
            with pytest.raises(BackendUnavailable) as caught:
                await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
            assert loop.time() - started < scaled(5)  # within connect_timeout, default 5 s
            assert address in str(caught.value) and cause in str(caught.value)
        finally:
            await locks.aclose()


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


async def test_a_silent_listener_times_out_after_connect_timeout(silent_listener: int) -> None:
    loop = asyncio.get_running_loop()
    timeout = scaled(1)
    locks = asynclock.connect(f"postgresql://postgres@127.0.0.1:{silent_listener}/postgres", connect_timeout=timeout)
    try:
        started = loop.time()
        with pytest.raises(BackendUnavailable) as caught:
            await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
        assert timeout <= loop.time() - started + 0.05 < timeout + scaled(3)
        assert f"127.0.0.1:{silent_listener}" in str(caught.value)
        assert f"timed out after {timeout:.1f} s" in str(caught.value)
    finally:
        await locks.aclose()


# -- options are checked before any I/O ------------------------------------------------------------


async def test_unknown_options_and_url_parameters_raise_value_error_naming_the_closest() -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"  # any I/O would fail otherwise
    for url, options, wrong, meant in (
        (f"{nowhere}?max_lease=3", {}, "max_lease", "max_leases"),
        (f"{nowhere}?tabel=t", {}, "tabel", "table"),
        (f"{nowhere}?tll=5", {}, "tll", "ttl"),
        (f"{nowhere}?conect_timeout=5", {}, "conect_timeout", "connect_timeout"),
        (f"{nowhere}?ssl_mode=require", {}, "ssl_mode", "sslmode"),
        (f"{nowhere}?max-leases=3", {}, "max-leases", "max_leases"),
        (nowhere, {"max_lease": 3}, "max_lease", "max_leases"),
        (nowhere, {"comand_timeout": 3}, "comand_timeout", "command_timeout"),
        (nowhere, {"statement_cache": 3}, "statement_cache", "statement_cache_size"),
    ):
        with pytest.raises(ValueError) as caught:
            asynclock.connect(url, **options)
        text = str(caught.value)
        assert repr(wrong) in text and f"did you mean {meant!r}?" in text, text
        assert "max_leases" in text and "table" in text  # the valid ones are listed
    # server settings (and what asyncpg reads itself) are not options of ours: they pass
    asynclock.connect(f"{nowhere}?application_name=a&search_path=s&statement_timeout=5&sslmode=disable")
    asynclock.connect(nowhere, statement_cache_size=0, server_settings={"application_name": "a"})
    with pytest.raises(ValueError, match="max_leases"):
        asynclock.connect(nowhere, max_size=3)


async def test_a_given_pool_refuses_unknown_options() -> None:
    pool = await asyncpg.create_pool(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", min_size=0)
    try:
        with pytest.raises(ValueError, match="did you mean 'max_leases'"):
            asynclock.connect(pool, max_lease=3)
        with pytest.raises(ValueError, match="did you mean 'table'"):
            asynclock.connect(pool, tabel="t")
    finally:
        await pool.close()


# -- one number of permits per semaphore -----------------------------------------------------------


async def test_a_semaphore_client_with_other_permits_gets_value_error_and_leaves_nothing(
    pg: PostgresHarness,
) -> None:
    first, other, same = pg.connect(ttl=TTL), pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    gate = unsigned(gate_key(pg.prefix, "gpu"))

    async def sessions_on_the_gate() -> int:
        count = await (await pg.admin()).fetchval(
            """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
               AND classid::int8 = $1 AND objid::int8 = $2""",
            *gate,
        )
        return int(count)

    mine = first.semaphore("gpu", permits=2)
    await mine.acquire(timeout=0)
    # more permits than the holders' (a free slot would let it in) ...
    with pytest.raises(ValueError) as caught:
        await asyncio.wait_for(other.semaphore("gpu", permits=3).acquire(timeout=None), PATIENCE)
    assert "permits=2" in str(caught.value) and "permits=3" in str(caught.value)
    assert await pg.granted_to(other) == []
    # ... or fewer, when every slot it knows is taken (it would queue): refused before waiting
    second = asyncio.create_task(_hold(first.semaphore("gpu", permits=2)))
    await _until(lambda: _holders(first, "gpu", 2), 2)
    with pytest.raises(ValueError, match="permits=2"):
        await asyncio.wait_for(other.semaphore("gpu", permits=1).acquire(timeout=None), PATIENCE)
    assert await pg.granted_to(other) == []
    assert await sessions_on_the_gate() == 0  # nobody queued
    # the same number is welcome
    with pytest.raises(LockTimeout):
        await same.semaphore("gpu", permits=2).acquire(timeout=0)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await mine.release()
    # once nobody holds with 2, a client may use another number, and then the others may not
    async with other.semaphore("gpu", permits=3) as lease:
        assert lease.token is not None
        with pytest.raises(ValueError, match="permits=3"):
            await first.semaphore("gpu", permits=2).acquire(timeout=0)
        # (its holders take the key of their number: that is how the others find them)
        held_keys = {(row["classid"], row["objid"]) for row in await (await pg.admin()).fetch(HELD_SQL)}
        assert unsigned(permits_key(pg.prefix, "gpu", 3)) in held_keys
        assert unsigned(permits_key(pg.prefix, "gpu", 2)) not in held_keys


async def _hold(sem: asynclock.Semaphore) -> None:
    async with sem:
        await asyncio.sleep(1000)


async def _holders(locks: asynclock.Locks, name: str, permits: int) -> int:
    return len((await locks.semaphore(name, permits=permits).info()).holders)


async def _until(count: Callable[[], Awaitable[int]], wanted: int) -> None:
    async with asyncio.timeout(PATIENCE):
        while await count() != wanted:
            await asyncio.sleep(0.01)
