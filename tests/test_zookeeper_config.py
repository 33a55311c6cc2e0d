"""ZooKeeper: mistakes in the configuration say what is wrong, at once, and nothing retries them forever.

Against real servers: a refused connection, an unresolvable name and a silent
listener within ``connect_timeout`` (and no reconnecting afterwards); a chroot
that does not exist; a chroot whose ACL refuses the client (digest
credentials in the URL, wrong or missing); every combination of ``ttl`` and
``session_timeout``; unknown options; and a semaphore whose clients disagree
on the permits.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockTimeout
from asynclock.backends.zookeeper import ZooKeeperBackend
from tests.faults import hygiene
from tests.harnesses import insides
from tests.harnesses.zookeeper import AdminClient, ZooKeeperHarness
from tests.servers import free_port, scaled
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Longer than anything here may take: a configuration error must come well before it.
PATIENCE = scaled(20)


@pytest.fixture
async def zk(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zookeeper_server)
    async with harness:
        yield harness


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="asynclock"):
        yield caplog


def backend_of(locks: asynclock.Locks) -> ZooKeeperBackend:
    backend = locks.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


# -- the server cannot be reached ------------------------------------------------------------------


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


async def _unreachable(locks: asynclock.Locks) -> tuple[BackendUnavailable, float]:
    """The BackendUnavailable of an acquire that would wait forever, how long it took, and then
    nothing of asynclock may still run (no reconnecting behind the caller's back)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(BackendUnavailable) as caught:
        await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
    took = loop.time() - started
    assert await hygiene.pending_asynclock_tasks(grace=scaled(0.5)) == []
    return caught.value, took


async def test_a_refused_connection_fails_at_once_and_nothing_keeps_reconnecting() -> None:
    port = free_port()
    connect_timeout = scaled(10)
    locks = asynclock.connect(f"zk://127.0.0.1:{port}", connect_timeout=connect_timeout)
    try:
        error, took = await _unreachable(locks)
        assert took < connect_timeout / 2  # nobody listens: waiting cannot help
        assert f"127.0.0.1:{port}: connection refused" in str(error)
        # and again on the next call (a fresh attempt, which stops as well)
        error, _ = await _unreachable(locks)
        assert "connection refused" in str(error)
    finally:
        await locks.aclose()


async def test_an_unresolvable_name_fails_within_connect_timeout() -> None:
    locks = asynclock.connect("zk://nowhere.invalid:2181,127.0.0.1:1?connect_timeout=3")
    try:
        error, took = await _unreachable(locks)
        assert took < scaled(3)
        assert "nowhere.invalid:2181: name not resolved" in str(error)
        assert "127.0.0.1:1: connection refused" in str(error)
    finally:
        await locks.aclose()


async def test_a_silent_listener_fails_after_connect_timeout(silent_listener: int) -> None:
    timeout = scaled(1)
    locks = asynclock.connect(f"zk://127.0.0.1:{silent_listener}", connect_timeout=timeout)
    try:
        error, took = await _unreachable(locks)
        assert timeout - 0.05 <= took < timeout + scaled(3)
        assert f"127.0.0.1:{silent_listener}: timed out" in str(error)
    finally:
        await locks.aclose()


async def test_a_cancelled_first_connection_stops_trying(silent_listener: int) -> None:
    locks = asynclock.connect(f"zk://127.0.0.1:{silent_listener}", connect_timeout=scaled(10))
    try:
        attempt = asyncio.create_task(locks.lock("x").acquire(timeout=None))
        await asyncio.sleep(scaled(0.3))
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        assert await hygiene.pending_asynclock_tasks(grace=scaled(0.5)) == []
    finally:
        await locks.aclose()


# -- the chroot --------------------------------------------------------------------------------------


async def test_a_chroot_that_does_not_exist_is_a_configuration_error(zk: ZooKeeperHarness) -> None:
    chroot = f"/{zk.prefix}-missing"
    locks = zk_client(zk, chroot)
    with pytest.raises(ConfigurationError) as caught:
        await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
    assert chroot in str(caught.value) and zk.server.hostport in str(caught.value)
    admin = await zk.admin()
    assert await admin.stat(chroot) is None  # not made by us
    with pytest.raises(ConfigurationError, match="does not exist"):
        async with asynclock.connect(f"zk://{zk.hosts}{chroot}", ttl=TTL):
            pass
    # once it exists, the same client works
    await admin.create(chroot)
    try:
        async with locks.lock("x") as lease:
            assert lease.token is not None
        await locks.aclose()
    finally:
        await admin.delete_tree(chroot)


def zk_client(zk: ZooKeeperHarness, chroot: str, userinfo: str = "", **options: object) -> asynclock.Locks:
    locks = asynclock.connect(f"zk://{userinfo}{zk.hosts}{chroot}", ttl=TTL, prefix=zk.prefix, **options)
    insides.adopt(zk, locks)
    return locks


def digest(user: str, password: str) -> str:
    """ZooKeeper's digest id of ``user:password`` (what an ACL names)."""
    hashed = base64.b64encode(hashlib.sha1(f"{user}:{password}".encode()).digest()).decode()
    return f"{user}:{hashed}"


async def test_a_chroot_whose_acl_refuses_the_client_is_a_configuration_error(
    zk: ZooKeeperHarness, logs: pytest.LogCaptureFixture
) -> None:
    user, password = "app", f"pw-{secrets.token_hex(6)}"
    wrong = f"not-{password}"
    chroot = f"/{zk.prefix}-acl"
    admin = AdminClient(zk.hosts, auth=("digest", f"{user}:{password}".encode()))
    await admin.start()
    await admin.create(chroot, [("digest", digest(user, password), 31)])
    try:
        strangers = [zk_client(zk, chroot, f"{user}:{wrong}@"), zk_client(zk, chroot)]
        for locks in strangers:  # nothing under the chroot yet
            with pytest.raises(ConfigurationError) as caught:
                await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
            assert zk.server.hostport in str(caught.value) and "NoAuth" in str(caught.value)
            assert password not in str(caught.value) and wrong not in str(caught.value)
        # the credentials of the ACL get in; what they create is theirs alone
        member = zk_client(zk, chroot, f"{user}:{password}@")
        async with member.lock("x") as lease:
            assert lease.token is not None
            base = f"{chroot}/{zk.prefix}"
            assert await admin.acl(base) == [("digest", digest(user, password), 31)]
            for locks in strangers:  # so the prefix that exists now refuses them too
                with pytest.raises(ConfigurationError, match="NoAuth"):
                    await asyncio.wait_for(locks.lock("y").acquire(timeout=None), PATIENCE)
        for locks in [*strangers, member]:
            await locks.aclose()
        assert not any(password in r.getMessage() or wrong in r.getMessage() for r in logs.records)
    finally:
        await admin.delete_tree(chroot)
        await admin.close()


# -- ttl and session timeout -----------------------------------------------------------------------


async def test_the_ttl_follows_a_given_session_timeout(zk: ZooKeeperHarness) -> None:
    session = scaled(0.8)
    locks = asynclock.connect(f"{zk.url}?session_timeout={session}", prefix=zk.prefix)
    insides.adopt(zk, locks)
    assert locks.ttl == session and backend_of(locks).session.requested_timeout == session
    async with locks.lock("follows") as lease:
        await asyncio.sleep(3 * session)  # renewed (the session's heartbeat) all along
        assert not lease.lost


async def test_every_ttl_and_session_timeout_works_or_is_refused_at_connect(zk: ZooKeeperHarness) -> None:
    session = scaled(0.8)
    works = [
        ({}, {}, 30.0, 30.0),  # neither: 30 s both
        ({"ttl": session}, {}, session, session),  # the session timeout is the ttl
        ({}, {"session_timeout": session}, session, session),  # the ttl follows the session
        ({"ttl": session / 2}, {"session_timeout": session}, session / 2, session),
        ({"ttl": 1.5 * session}, {"session_timeout": session}, 1.5 * session, session),
        ({}, {"ttl": session, "session_timeout": 2 * session}, session, 2 * session),  # both in the URL
    ]

    async def holds(index: int, options: dict[str, float], query: dict[str, float], ttl: float, asked: float) -> None:
        url = zk.url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        locks = asynclock.connect(url, prefix=zk.prefix, **options)
        insides.adopt(zk, locks)
        assert (locks.ttl, backend_of(locks).session.requested_timeout) == (ttl, asked)
        if ttl < 5:
            async with locks.lock(f"combination-{index}") as lease:
                await asyncio.sleep(2 * asked)
                assert not lease.lost
        await locks.aclose()

    # side by side: each holds its own lock past twice its session timeout
    async with asyncio.TaskGroup() as group:
        for index, combination in enumerate(works):
            group.create_task(holds(index, *combination))
    # a ttl the session cannot carry is refused at connect(), whichever way it is given
    for url, options in (
        (f"{zk.url}?session_timeout={session}", {"ttl": 3 * session}),
        (f"{zk.url}?session_timeout={session}&ttl={3 * session}", {}),
        (f"{zk.url}?ttl={3 * session}", {"session_timeout": session}),
    ):
        with pytest.raises(ValueError, match="session"):
            asynclock.connect(url, prefix=zk.prefix, **options)
    # and a lock's own ttl when the handle is made, before any I/O
    locks = asynclock.connect(f"{zk.url}?session_timeout={session}", prefix=zk.prefix)
    with pytest.raises(ValueError, match="session"):
        locks.lock("long", ttl=3 * session)
    assert locks.lock("short", ttl=session / 2).ttl == session / 2


async def test_a_session_the_server_shortens_below_the_ttl_is_refused_when_connecting(
    zookeeper_server: ZooKeeperServer,
) -> None:
    # The test server allows sessions of 60 s at most: a 150 s ttl (and session) asked for
    # gets a 60 s session, which the watchdog's renewals every 50 s cannot carry.
    with pytest.raises(ConfigurationError) as caught:
        async with asynclock.connect(zookeeper_server.url, ttl=150):
            pass
    assert zookeeper_server.hostport in str(caught.value) and "60 s" in str(caught.value)


# -- options are checked before any I/O ------------------------------------------------------------


def test_unknown_options_raise_value_error_naming_the_closest() -> None:
    nowhere = f"zk://127.0.0.1:{free_port()}"  # any I/O would fail otherwise
    for url, options, wrong, meant in (
        (f"{nowhere}?session_timout=5", {}, "session_timout", "session_timeout"),
        (f"{nowhere}?tll=5", {}, "tll", "ttl"),
        (nowhere, {"sesion_timeout": 5}, "sesion_timeout", "session_timeout"),
    ):
        with pytest.raises(ValueError) as caught:
            asynclock.connect(url, **options)
        text = str(caught.value)
        assert repr(wrong) in text and f"did you mean {meant!r}?" in text, text
        assert "session_timeout" in text and "connect_timeout" in text
    with pytest.raises(ValueError, match="user:password"):
        asynclock.connect(f"zk://someone@127.0.0.1:{free_port()}")


# -- one number of permits per semaphore -----------------------------------------------------------


async def test_a_semaphore_client_with_other_permits_gets_value_error_and_leaves_nothing(
    zk: ZooKeeperHarness,
) -> None:
    first, other, same = zk.connect(ttl=TTL), zk.connect(ttl=TTL), zk.connect(ttl=TTL)
    admin = await zk.admin()
    mine = first.semaphore("gpu", permits=2)
    await mine.acquire(timeout=0)
    leases = f"{mine.key}/leases"
    [node] = await admin.contenders(leases)
    assert await admin.data(node) == b"asynclock permits=2"  # where Curator keeps only its address
    # more permits than the holders' (a free permit would let it in) ...
    with pytest.raises(ValueError) as caught:
        await asyncio.wait_for(other.semaphore("gpu", permits=3).acquire(timeout=None), PATIENCE)
    assert "permits=2" in str(caught.value) and "permits=3" in str(caught.value)
    assert await admin.contenders(leases) == [node]
    # ... or fewer, when every permit it knows is taken (it would queue): refused before waiting
    second = asyncio.create_task(_hold(first.semaphore("gpu", permits=2)))
    async with asyncio.timeout(PATIENCE):
        while len(await admin.contenders(leases)) < 2:
            await asyncio.sleep(0.01)
    with pytest.raises(ValueError, match="permits=2"):
        await asyncio.wait_for(other.semaphore("gpu", permits=1).acquire(timeout=None), PATIENCE)
    assert len(await admin.contenders(leases)) == 2
    assert await admin.contenders(f"{mine.key}/locks") == []
    # the same number is welcome
    with pytest.raises(LockTimeout):
        await same.semaphore("gpu", permits=2).acquire(timeout=0)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await mine.release()
    # once nobody holds with 2, a client may use another number, and then the others may not
    async with other.semaphore("gpu", permits=3):
        with pytest.raises(ValueError, match="permits=3"):
            await first.semaphore("gpu", permits=2).acquire(timeout=0)


async def _hold(sem: asynclock.Semaphore) -> None:
    async with sem:
        await asyncio.sleep(1000)
