"""Mistakes in connecting to Redis, on every scheme of the family (redis://,
rediss://, unix://, redis+sentinel://, redis+cluster://, redlock://, a given
client): what no retry can fix is a ConfigurationError at once, a server that
cannot be reached is a BackendUnavailable within the connect timeout, and an
option nobody takes is a ValueError before any I/O. Every message names the
server and never a password.

(Sentinel's and Cluster's refusals by a real server are in test_sentinel.py
and test_cluster.py, on their topologies.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, ConfigurationError
from tests.servers import RedisServer, free_port, scaled
from tests.servers.redis_topologies import RedisNodes

pytestmark = pytest.mark.anyio

#: The password every refused client sends: it must appear in no message or log line.
WRONG = "wr0ng-Pa55w0rd"
RIGHT = "r1ght-Pa55w0rd"
#: ACL users: every right, no right to run scripts, no right to any pub/sub channel; and
#: users who may run scripts but not a command the lock's scripts run: TIME, or any write.
USERS = {
    "locker": ["on", f">{RIGHT}", "~*", "&*", "+@all"],
    "noscript": ["on", f">{RIGHT}", "~*", "&*", "+@all", "-@scripting"],
    "nochannel": ["on", f">{RIGHT}", "~*", "resetchannels", "+@all"],
    "notime": ["on", f">{RIGHT}", "~*", "&*", "+@all", "-time"],
    "readonly": ["on", f">{RIGHT}", "~*", "&*", "+@all", "-@write"],
}


async def add_users(*urls: str) -> None:
    for url in urls:
        admin = aioredis.Redis.from_url(url)
        try:
            for user, rules in USERS.items():
                await admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
        finally:
            await admin.aclose()


@pytest.fixture
async def server(redis_server: RedisServer) -> AsyncIterator[RedisServer]:
    """The session's redis-server, with the ACL users above."""
    await add_users(redis_server.url)
    yield redis_server


@pytest.fixture
def tls_server() -> Iterator[RedisServer]:
    server = RedisServer(tls=True)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="asynclock")
    return caplog


def assert_never_shown(secret: str, error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    assert secret not in str(error) and secret not in repr(error)
    for record in caplog.records:
        assert secret not in record.getMessage(), record.getMessage()


async def refused(
    locks: asynclock.Locks,
    *,
    name: str = "refused",
    within: float = 3.0,
    timeout: float | None = None,
    on_opening: bool = True,
) -> ConfigurationError:
    """The ConfigurationError of an acquire (that would wait for ever) of a client used
    without being opened, raised at once; and, ``on_opening``, the same refusal when the
    client is opened (not where only a write or a channel is refused: opening reads)."""
    try:
        with pytest.raises(ConfigurationError) as caught:
            async with asyncio.timeout(scaled(within)):  # not retried for a ttl (30 s)
                await locks.lock(name).acquire(timeout=timeout)
        if on_opening:
            with pytest.raises(ConfigurationError) as opening:
                async with asyncio.timeout(scaled(within)):
                    await locks.open()  # its round trip on opening meets the refusal too
            assert type(opening.value) is type(caught.value)
    finally:
        await locks.aclose()
    return caught.value


# -- 2. what no retry can fix ---------------------------------------------------------


@pytest.mark.parametrize("scheme", ["redis", "unix", "given"])
async def test_a_wrong_password_is_a_configuration_error_at_once(
    server: RedisServer, scheme: str, logged: pytest.LogCaptureFixture
) -> None:
    if scheme == "redis":
        where = f"127.0.0.1:{server.port}"
        target: Any = f"redis://locker:{WRONG}@127.0.0.1:{server.port}/0"
    elif scheme == "unix":
        where = str(server.socket_path)
        target = f"unix://locker:{WRONG}@{server.socket_path}"
    else:
        where = f"127.0.0.1:{server.port}"
        target = aioredis.Redis.from_url(f"redis://locker:{WRONG}@127.0.0.1:{server.port}/0")
    error = await refused(asynclock.connect(target))
    assert where in str(error)
    assert "invalid username-password pair" in str(error)  # the server's own words
    assert_never_shown(WRONG, error, logged)
    if scheme == "given":
        await target.aclose()


async def test_no_password_for_a_server_that_wants_one_is_a_configuration_error(
    redis_fresh: RedisServer, logged: pytest.LogCaptureFixture
) -> None:
    admin = aioredis.Redis.from_url(redis_fresh.url)
    await admin.config_set("requirepass", RIGHT)
    await admin.aclose()
    error = await refused(asynclock.connect(redis_fresh.url))
    assert f"127.0.0.1:{redis_fresh.port}" in str(error) and "authenticat" in str(error).lower()
    assert_never_shown(RIGHT, error, logged)
    # the right password works
    async with asynclock.connect(f"redis://:{RIGHT}@127.0.0.1:{redis_fresh.port}/0") as locks:
        async with locks.lock("fine") as lease:
            assert lease.token is not None


@pytest.fixture
def password_server() -> Iterator[RedisServer]:
    """A redis-server started with ``requirepass``."""
    server = RedisServer(password=RIGHT)
    server.start()
    yield server
    server.cleanup()


@pytest.mark.parametrize("scheme", ["redis", "unix", "redlock", "given"])
async def test_a_server_that_wants_a_password_and_got_none_says_so_and_how_to_give_it(
    password_server: RedisServer, scheme: str, logged: pytest.LogCaptureFixture
) -> None:
    """Redis's own words ("HELLO must be called with the client already authenticated")
    do not say that a password is missing: the ConfigurationError does, with the URL
    that gives one, and that URL (the password put in) works."""
    port, sock = password_server.port, password_server.socket_path
    target: Any = {
        "redis": f"redis://127.0.0.1:{port}/0",
        "unix": f"unix://{sock}",
        "redlock": f"redlock://127.0.0.1:{port}",
        "given": aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0"),
    }[scheme]
    error = await refused(asynclock.connect(target))
    text = str(error)
    where = str(sock) if scheme == "unix" else f"127.0.0.1:{port}"
    assert f"{where} wants a password, and none was given" in text, text
    assert "HELLO must be called" in text  # the server's own words are still quoted
    if scheme == "given":
        await target.aclose()
        assert "give the client you passed to connect() one (password=" in text, text
        target = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", password=RIGHT)
        fixed: Any = target
    else:
        hinted = {
            "redis": f"redis://:PASSWORD@127.0.0.1:{port}/0",
            "unix": f"unix://:PASSWORD@{sock}",
            "redlock": f"redlock://:PASSWORD@127.0.0.1:{port}",
        }[scheme]
        assert f"put it in the URL, {hinted} (or " in text, text
        fixed = hinted.replace("PASSWORD", RIGHT)
    try:
        async with asynclock.connect(fixed) as locks:
            async with locks.lock("fine") as lease:
                assert lease.hold_count == 1
    finally:
        if scheme == "given":
            await target.aclose()
    assert_never_shown(RIGHT, error, logged)


async def test_a_wrong_password_is_still_called_refused_credentials(password_server: RedisServer) -> None:
    error = await refused(asynclock.connect(f"redis://:{WRONG}@127.0.0.1:{password_server.port}/0"))
    assert "refused the credentials" in str(error) and "wants a password" not in str(error)


async def test_an_acl_refusal_is_a_configuration_error(server: RedisServer, logged: pytest.LogCaptureFixture) -> None:
    error = await refused(asynclock.connect(f"redis://noscript:{RIGHT}@127.0.0.1:{server.port}/0"))
    assert f"127.0.0.1:{server.port}" in str(error)
    assert "no permissions" in str(error)  # the server's own words
    assert_never_shown(RIGHT, error, logged)


@pytest.mark.parametrize("user", ["notime", "readonly"])
async def test_an_acl_refusal_of_a_command_inside_a_script_is_a_configuration_error(
    server: RedisServer, user: str, logged: pytest.LogCaptureFixture
) -> None:
    """A user who may run scripts but not a command they run (TIME, or a write): the server
    refuses it from inside the script, and redis-py gives a plain ResponseError. That is a
    refusal no retry fixes, raised at once, not BackendUnavailable after retrying for a ttl."""
    url = f"redis://{user}:{RIGHT}@127.0.0.1:{server.port}/0"
    error = await refused(asynclock.connect(url, ttl=30), on_opening=user == "notime")
    assert f"127.0.0.1:{server.port}" in str(error)
    assert "The user executing the script can't run this command" in str(error)  # the server's own words
    assert isinstance(error.__cause__, aioredis.ResponseError)
    assert_never_shown(RIGHT, error, logged)


async def test_an_acl_refusal_of_the_hand_over_channel_reaches_the_waiter(
    server: RedisServer, logged: pytest.LogCaptureFixture
) -> None:
    """A user without pub/sub rights (Redis 7's default for a new ACL user)
    can take a free lock, but a waiter can never be told of a hand-over: its
    acquire raises at once instead of polling for ever, and leaves nothing queued."""
    url = f"redis://nochannel:{RIGHT}@127.0.0.1:{server.port}/0"
    async with asynclock.connect(url, prefix="nochan") as holder:
        lock = holder.lock("c")
        await lock.acquire()
        error = await refused(asynclock.connect(url, prefix="nochan"), name="c", on_opening=False)
        assert f"127.0.0.1:{server.port}" in str(error) and "permissions" in str(error)
        assert_never_shown(RIGHT, error, logged)
        info = await lock.info()
        assert info.waiters == 0 and info.hold_count == 1
        await lock.release()


@pytest.mark.parametrize("scheme", ["redis", "unix"])
async def test_a_database_out_of_range_is_a_configuration_error(server: RedisServer, scheme: str) -> None:
    if scheme == "redis":
        where, url = f"127.0.0.1:{server.port}", f"redis://127.0.0.1:{server.port}/99"
    else:
        where, url = str(server.socket_path), f"unix://{server.socket_path}?db=99"
    error = await refused(asynclock.connect(url))
    assert where in str(error) and "DB index is out of range" in str(error)


async def test_a_tls_certificate_from_another_ca_is_a_configuration_error(tls_server: RedisServer) -> None:
    other = RedisServer(tls=True)  # only for its CA (never started)
    other._make_certificates()
    try:
        url = f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs={other.workdir / 'ca.crt'}"
        error = await refused(asynclock.connect(url))
        assert f"127.0.0.1:{tls_server.port}" in str(error) and "certificate" in str(error)
    finally:
        other.cleanup()
    # the right CA works
    async with asynclock.connect(tls_server.tls_url) as locks:
        async with locks.lock("fine") as lease:
            assert lease.token is not None


async def test_a_refusal_ends_an_acquire_with_a_timeout_and_a_try_too(server: RedisServer) -> None:
    url = f"redis://locker:{WRONG}@127.0.0.1:{server.port}/0"
    await refused(asynclock.connect(url), timeout=60)
    await refused(asynclock.connect(url), timeout=0)


async def test_a_redlock_refused_by_its_nodes_is_a_configuration_error(
    redlock_nodes: RedisNodes, logged: pytest.LogCaptureFixture
) -> None:
    await add_users(*(node.url for node in redlock_nodes.servers))
    hosts = ",".join(f"127.0.0.1:{node.port}" for node in redlock_nodes.servers)
    error = await refused(asynclock.connect(f"redlock://locker:{WRONG}@{hosts}"))
    assert "invalid username-password pair" in str(error) and f"127.0.0.1:{redlock_nodes[0].port}" in str(error)
    assert_never_shown(WRONG, error, logged)
    error = await refused(asynclock.connect(f"redlock://{hosts}/99"))
    assert "DB index is out of range" in str(error)


# -- 3. a server that cannot be reached ---------------------------------------------


def _unreachable_targets() -> list[Any]:
    closed = [free_port() for _ in range(3)]
    nodes = ",".join(f"127.0.0.1:{port}" for port in closed)
    return [
        pytest.param(f"redis://127.0.0.1:{closed[0]}/0", f"127.0.0.1:{closed[0]}", "connection refused", id="redis"),
        pytest.param(
            "redis://no-such-host.invalid:6379/0", "no-such-host.invalid", "name not resolved", id="redis-dns"
        ),
        pytest.param(f"rediss://127.0.0.1:{closed[0]}/0", f"127.0.0.1:{closed[0]}", "connection refused", id="rediss"),
        pytest.param("unix:///nonexistent/asynclock/redis.sock", "/nonexistent/asynclock", "no socket", id="unix"),
        pytest.param(
            f"redis+sentinel://127.0.0.1:{closed[0]}/mymaster", f"127.0.0.1:{closed[0]}", "refused", id="sentinel"
        ),
        pytest.param(
            "redis+sentinel://no-such-host.invalid:26379/mymaster",
            "no-such-host.invalid",
            "name not resolved",
            id="sentinel-dns",
        ),
        pytest.param(f"redis+cluster://{nodes}", f"127.0.0.1:{closed[0]}", "connection refused", id="cluster"),
        pytest.param(
            "redis+cluster://no-such-host.invalid:7000", "no-such-host.invalid", "name not resolved", id="cluster-dns"
        ),
        pytest.param(f"redlock://{nodes}", f"127.0.0.1:{closed[0]}", "connection refused", id="redlock"),
        pytest.param(
            "redlock://a.invalid:1,b.invalid:2,c.invalid:3", "a.invalid:1", "name not resolved", id="redlock-dns"
        ),
        pytest.param("given", f"127.0.0.1:{closed[0]}", "connection refused", id="given"),
    ]


@pytest.mark.parametrize(("target", "where", "cause"), _unreachable_targets())
async def test_an_unreachable_server_fails_within_the_connect_timeout(target: str, where: str, cause: str) -> None:
    """A refused connection or a name that does not resolve: BackendUnavailable
    within ``connect_timeout`` (here 1 s; the default ttl is 30 s), naming the
    address and the cause, from an acquire that would otherwise wait for ever.
    (The connect timeout comes as a keyword for a refused connection, as a
    URL parameter for a name that does not resolve.)"""
    connect_timeout = scaled(1.0)
    as_url = "invalid" in target
    client = None
    if target == "given":
        client = aioredis.Redis.from_url(f"redis://{where}/0")
        locks = asynclock.connect(client, connect_timeout=connect_timeout)
    elif as_url:
        joiner = "&" if "?" in target else "?"
        locks = asynclock.connect(f"{target}{joiner}connect_timeout={connect_timeout}")
    else:
        locks = asynclock.connect(target, connect_timeout=connect_timeout)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(BackendUnavailable) as caught:
            async with asyncio.timeout(connect_timeout + scaled(5)):
                await locks.lock("unreachable").acquire()
        assert loop.time() - started <= connect_timeout + scaled(1.0)
        assert where in str(caught.value) and cause in str(caught.value), str(caught.value)
    finally:
        await locks.aclose()
        if client is not None:
            await client.aclose()


async def test_a_server_that_accepts_and_then_says_nothing_is_waited_for_a_ttl(redis_fresh: RedisServer) -> None:
    """Connected, but silent (paused): not an unreachable server; the acquire
    keeps waiting for it for the ttl, not only for the connect timeout."""
    loop = asyncio.get_running_loop()
    ttl = scaled(1.5)
    locks = asynclock.connect(redis_fresh.url, ttl=ttl, connect_timeout=scaled(0.2))
    redis_fresh.pause()
    started = loop.time()
    try:
        with pytest.raises(BackendUnavailable):
            async with asyncio.timeout(ttl * 3):
                await locks.lock("silent").acquire()
        assert loop.time() - started >= ttl * 0.9
    finally:
        redis_fresh.resume()
        await locks.aclose()


# -- 4. options checked before any I/O -------------------------------------------------

UNKNOWN = [
    ("redis://127.0.0.1:1/0?tll=5", {}, "ttl"),
    ("redis://127.0.0.1:1/0?replica_timout=1", {}, "replica_timeout"),
    ("redis://127.0.0.1:1/0?socket_timout=1", {}, "socket_timeout"),
    ("redis://127.0.0.1:1/0", {"tll": 5}, "ttl"),
    ("redis://127.0.0.1:1/0", {"replica_timout": 1}, "replica_timeout"),
    ("rediss://127.0.0.1:1/0?ssl_ca_cert=/x", {}, "ssl_ca_certs"),
    ("unix:///tmp/redis.sock?tll=5", {}, "ttl"),
    ("unix:///tmp/redis.sock", {"prefx": "p"}, "prefix"),
    ("redis+sentinel://127.0.0.1:1/mymaster?tll=5", {}, "ttl"),
    ("redis+sentinel://127.0.0.1:1/mymaster?replica_timout=1", {}, "replica_timeout"),
    ("redis+sentinel://127.0.0.1:1/mymaster?sentinel_pasword=x", {}, "sentinel_password"),
    ("redis+sentinel://127.0.0.1:1/mymaster", {"socket_timout": 1}, "socket_timeout"),
    ("redis+cluster://127.0.0.1:1?tll=5", {}, "ttl"),
    ("redis+cluster://127.0.0.1:1", {"read_from_replica": True}, "read_from_replicas"),
    ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timout=1", {}, "node_timeout"),
    ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", {"tll": 5}, "ttl"),
]


@pytest.mark.parametrize(("url", "options", "meant"), UNKNOWN)
def test_an_unknown_option_is_refused_with_the_closest_valid_one(url: str, options: dict[str, Any], meant: str) -> None:
    with pytest.raises(ValueError, match=f"did you mean '{meant}'") as caught:
        asynclock.connect(url, **options)
    assert "valid:" in str(caught.value) and "connect_timeout" in str(caught.value)


async def test_a_given_client_takes_only_asynclocks_options() -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(ValueError, match="did you mean 'replicas'"):
            asynclock.connect(client, replica=1)
        locks = asynclock.connect(client, replicas=1, replica_timeout=0.2)
        await locks.aclose()
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/abc",
        "rediss://127.0.0.1:1/0x1",
        "redis://127.0.0.1:1/0/1",
        "redis+sentinel://127.0.0.1:1/mymaster/abc",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/abc",
        "redis+cluster://127.0.0.1:1/abc",
    ],
)
def test_a_database_that_is_not_a_number_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="database"):
        asynclock.connect(url)


def test_what_redis_py_takes_still_passes_through() -> None:
    locks = asynclock.connect(
        "redis://127.0.0.1:1/2?socket_timeout=2&health_check_interval=10&client_name=me&replicas=1",
        max_connections=7,
    )
    pool = locks.backend.client.connection_pool  # type: ignore[attr-defined]
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["socket_timeout"], kwargs["health_check_interval"]) == (2, 2.0, 10)
    assert kwargs["client_name"] == "me" and pool.max_connections == 7
    locks = asynclock.connect("redis+sentinel://127.0.0.1:1/mymaster/3?health_check_interval=4&min_other_sentinels=1")
    kwargs = locks.backend.client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    assert (kwargs["db"], kwargs["health_check_interval"]) == (3, 4)
    assert locks.backend.sentinel.min_other_sentinels == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{WRONG}@127.0.0.1:1/abc",
        f"redis+sentinel://user:{WRONG}@127.0.0.1:1/mymaster/abc",
        f"redis+sentinel://:{WRONG}@nohost/mymaster",
        f"redlock://:{WRONG}@127.0.0.1:1/abc",
        f"redis+cluster://:{WRONG}@nohost",
    ],
)
def test_a_bad_url_is_quoted_without_its_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        asynclock.connect(url)
    assert WRONG not in str(caught.value)
