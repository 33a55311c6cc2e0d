"""Mistakes and failures name themselves in the user's words.

* An unknown option lists the valid ones as each backend's docs page lists
  them (parsed from the page, so the two cannot drift apart), never the
  dozens of names a client library's signatures hold.
* A failure (nothing listening, a server that stopped answering, a server
  killed under a held lock) says what happened in words, on every backend:
  no private module or class of asynclock's, no client library's exception
  class or repr, in the message, in the traceback's last line, or in a log
  line.
* Each failure is logged once: a renewal that keeps failing the same way, a
  release that fails and is retried in the background, a listener that
  keeps reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import re
import traceback
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock
from asynclock import BackendUnavailable, LockError, LockLost
from asynclock.testing import faults, virtual_clock
from tests.servers import RedisServer, free_port, scaled
from tests.servers.base import ServerProcess
from tests.servers.etcd import EtcdServer
from tests.servers.postgres import PostgresServer
from tests.servers.zookeeper import ZooKeeperServer

DOCS = Path(__file__).resolve().parent.parent / "docs" / "backends"
#: What every backend takes (``on_event`` and ``require`` as keywords only).
EVERY_CLIENT = {"ttl", "prefix", "connect_timeout", "on_event", "require"}
_NAME = re.compile(r"`([a-z][a-z0-9_]*)`")


def documented(page: str, section: str | None = None) -> set[str]:
    """The options a backend's docs page lists: the backquoted names of its
    ``**Options**`` paragraph (in ``section``, a ``## `` heading) and of the first
    column of the table right after it."""
    text = (DOCS / page).read_text()
    if section is not None:
        text = text[text.index(f"\n## {section}\n") + 1 :]
        end = text.find("\n## ")
        text = text if end < 0 else text[:end]
    paragraphs = text.split("\n\n")
    for index, paragraph in enumerate(paragraphs):
        if re.match(r"\*\*(Options|URL and options)", paragraph):
            names = set(_NAME.findall(paragraph))
            table = paragraphs[index + 1] if index + 1 < len(paragraphs) else ""
            if table.startswith("|"):
                for row in table.splitlines()[2:]:
                    names |= set(_NAME.findall(row.split("|")[1]))
            return names
    raise AssertionError(f"no **Options** paragraph in {page} {section or ''}")


def listed(message: str) -> set[str]:
    """The options an unknown-option message lists as valid."""
    found = re.search(r"\(valid: ([a-z_, ]+)[;)]", message)
    assert found is not None, message
    return set(found.group(1).split(", "))


OPTION_PAGES = [
    pytest.param("memory://", "memory.md", None, id="memory"),
    pytest.param("redis://127.0.0.1:1/0", "redis.md", "One Redis server", id="redis"),
    pytest.param("rediss://127.0.0.1:1/0", "redis.md", "One Redis server", id="rediss"),
    pytest.param("unix:///nonexistent/redis.sock", "redis.md", "One Redis server", id="unix"),
    pytest.param("redis+sentinel://127.0.0.1:1/mymaster", "redis.md", "Sentinel", id="sentinel"),
    pytest.param("redis+cluster://127.0.0.1:1", "redis.md", "Cluster", id="cluster"),
    pytest.param("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "redlock.md", None, id="redlock"),
    pytest.param("zk://127.0.0.1:1", "zookeeper.md", None, id="zookeeper"),
    pytest.param("etcd://127.0.0.1:1", "etcd.md", None, id="etcd"),
    pytest.param("etcds://127.0.0.1:1", "etcd.md", None, id="etcds"),
    pytest.param("postgresql://app@127.0.0.1:1/db", "postgresql.md", None, id="postgresql"),
]


@pytest.mark.parametrize(("url", "page", "section"), OPTION_PAGES)
def test_an_unknown_option_lists_the_options_the_docs_list(url: str, page: str, section: str | None) -> None:
    """As a keyword and as a URL parameter (where ``on_event``, a callback, and ``require`` cannot be),
    before any I/O; the closest name is still suggested."""
    docs = documented(page, section)
    assert docs >= EVERY_CLIENT, docs  # (the paragraph was found)
    with pytest.raises(ValueError, match="did you mean 'ttl'") as keyword:
        asynclock.connect(url, tll=5)
    assert listed(str(keyword.value)) == docs, str(keyword.value)
    joiner = "&" if "?" in url else "?"
    with pytest.raises(ValueError, match="did you mean 'ttl'") as parameter:
        asynclock.connect(f"{url}{joiner}tll=5")
    assert listed(str(parameter.value)) == docs - {"on_event", "require"}, str(parameter.value)


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_a_given_redis_client_lists_the_options_the_docs_list(kind: str) -> None:
    if kind == "redis":
        client: Any = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
        docs = documented("redis.md", "One Redis server")
    else:
        client = aioredis.RedisCluster(host="127.0.0.1", port=1)
        docs = documented("redis.md", "Cluster")
    with pytest.raises(ValueError, match="did you mean 'ttl'") as caught:
        asynclock.connect(client, tll=5)
    assert listed(str(caught.value)) == docs


@pytest.mark.anyio
async def test_a_given_asyncpg_pool_lists_the_options_the_docs_list() -> None:
    import asyncpg

    pool = await asyncpg.create_pool("postgresql://app@127.0.0.1:1/db", min_size=0)
    try:
        with pytest.raises(ValueError, match="did you mean 'ttl'") as caught:
            asynclock.connect(pool, tll=5)
        assert listed(str(caught.value)) == documented("postgresql.md")
    finally:
        await pool.close()


def test_the_options_of_a_client_library_are_named_in_words_and_still_taken() -> None:
    """redis-py's signatures hold dozens of names (internals among them): the message
    says they go to redis-py instead of listing them, and a typo of one is still
    told the closest."""
    with pytest.raises(ValueError) as caught:
        asynclock.connect("redis://127.0.0.1:1/0?socket_timout=1")
    text = str(caught.value)
    assert "did you mean 'socket_timeout'" in text
    assert "and what redis-py's Redis.from_url takes" in text
    assert "maint_notifications" not in text and "connection_class" not in text, text
    asynclock.connect("redis://127.0.0.1:1/0?socket_timeout=1", health_check_interval=5)  # still taken


# -- failures, in words ----------------------------------------------------------------------------

#: What no user-facing text may show: a private module or class of asynclock's (a dotted
#: path with a part that starts with ``_``, a ``_Class``, or a ``_name`` that is no znode's),
#: a client library's exception class or repr (redis-py's is ``network:ConnectionError``).
LEAKS = re.compile(
    r"asynclock(\.\w+)*\._\w"
    r"|(?<![/\w])_[a-z]\w*\b(?!-)"
    r"|\b_[A-Z]"
    r"|Zk[A-Z]|Etcd[A-Z]|aiozk|asyncpg\.|grpc|AioRpcError|redis\.exceptions|\b(network|auth|server):[A-Z]"
    r"|\b[A-Z]\w*(Error|Exception|Loss)\(|<[\w.]+ object at"
)


def leaks(text: str) -> list[str]:
    return [found.group(0) for found in LEAKS.finditer(text)]


def test_the_leak_pattern_catches_what_messages_used_to_show() -> None:
    for shown in [
        "ZooKeeper at 127.0.0.1:2181: ZkConnectionLoss('no ZooKeeper server could be reached')",
        "lock server did not answer in time: TimeoutError()",
        "redis pub/sub connection lost, reconnecting: network:ConnectionError",
        "asynclock.backends.zookeeper._wire.ZkConnectionLoss: gone",
        "etcd at 127.0.0.1:2379: <AioRpcError of RPC that terminated with: status = StatusCode.UNAVAILABLE>",
        "could not release 'x' (_HoldRetired())",
    ]:
        assert leaks(shown), shown
    for fine in [
        "Redis at 127.0.0.1:6379 could not be reached: connection refused",
        "could not delete the ZooKeeper node /app/asynclock/x/_c_2f1e-lock-0000000001 of 'x'",
        "lock 'held' lost: the trusted deadline passed without a renewal (last renewal error: timed out)",
        "asynclock.BackendUnavailable: ZooKeeper at 127.0.0.1:2181 did not answer in time",
    ]:
        assert not leaks(fine), (fine, leaks(fine))


SERVERS: dict[str, type[ServerProcess]] = {
    "redis": RedisServer,
    "redlock": RedisServer,
    "postgres": PostgresServer,
    "zookeeper": ZooKeeperServer,
    "etcd": EtcdServer,
}


def url_at(kind: str, port: int, server: Any = None) -> str:
    if kind == "redlock":
        return f"redlock://127.0.0.1:{port}"
    if server is not None:
        return str(server.url)
    return {
        "redis": f"redis://127.0.0.1:{port}/0",
        "postgres": f"postgresql://postgres@127.0.0.1:{port}/postgres",
        "zookeeper": f"zk://127.0.0.1:{port}",
        "etcd": f"etcd://127.0.0.1:{port}",
    }[kind]


@pytest.fixture(params=list(SERVERS))
def fresh(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """A server of the test's own (it is paused and killed), of each kind."""
    kind: str = request.param
    server: Any = SERVERS[kind]()
    try:
        server.start()
        yield kind, server
    finally:
        server.cleanup()


class Said:
    """Every error the test met, and every log line at INFO or above, to be read for leaks."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.errors: list[BaseException] = []
        #: other texts shown to the user (a lease's ``lost_reason``)
        self.notes: list[str] = []

    async def failing(self, what: Awaitable[Any], within: float = 30.0) -> BaseException | None:
        """Await ``what``; the asynclock error it raised (kept), or None."""
        try:
            async with asyncio.timeout(scaled(within)):
                await what
        except LockError as exc:
            self.errors.append(exc)
            return exc
        return None

    def texts(self) -> list[str]:
        shown = []
        for error in self.errors:
            shown.append(str(error))
            shown.append("".join(traceback.format_exception_only(error)))  # the traceback's last line
            if isinstance(error, LockLost):
                shown.append(error.reason)
        shown += self.notes
        shown += [r.getMessage() for r in self.caplog.records if r.levelno >= logging.INFO]
        return shown


@pytest.mark.anyio
async def test_failures_on_every_backend_are_said_in_words(
    fresh: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listening, a paused server, a server killed under a held lock and a
    detached lease: what each operation raises, and what is logged, names the
    server and the cause in words; the client library's error stays the cause."""
    caplog.set_level(logging.DEBUG, logger="asynclock")
    kind, server = fresh
    said = Said(caplog)
    url = url_at(kind, server.port, server)
    ttl, quick = scaled(2.0), scaled(1.0)

    # nothing listening
    nowhere = url_at(kind, free_port())
    refused = await said.failing(asynclock.connect(nowhere, connect_timeout=quick).open())
    assert isinstance(refused, BackendUnavailable) and "refused" in str(refused), refused
    if kind not in ("zookeeper", "redlock"):  # (those say it from their own attempts, each named)
        assert refused.__cause__ is not None  # the client library's (or the socket's) error
    locks = asynclock.connect(nowhere, connect_timeout=quick)
    try:
        assert isinstance(await said.failing(locks.lock("x").acquire(timeout=quick)), BackendUnavailable)
    finally:
        await locks.aclose()

    # a server that does not answer
    server.pause()
    try:
        assert isinstance(await said.failing(asynclock.connect(url, connect_timeout=quick).open()), BackendUnavailable)
    finally:
        server.resume()

    # paused under a detached lease: its release and an acquire go unanswered
    async with asynclock.connect(url, ttl=ttl, connect_timeout=quick, prefix="words") as locks:
        lease = await locks.lock("paused").acquire(detached=True)
        server.pause()
        try:
            await said.failing(lease.release())
            await said.failing(locks.lock("other").acquire(timeout=quick))
        finally:
            server.resume()

    # killed under a held lock and a detached lease
    async with asynclock.connect(url, ttl=ttl, connect_timeout=quick, prefix="words") as locks:
        detached = await locks.lock("detached").acquire(detached=True)
        entered = asyncio.Event()

        async def hold() -> None:
            async with locks.lock("held"):
                entered.set()
                await asyncio.sleep(3600)

        holder = asyncio.create_task(hold())
        await entered.wait()
        server.kill()
        assert isinstance(await said.failing(holder), LockLost)
        await said.failing(detached.wait_lost())
        said.notes.append(detached.lost_reason or "")
        assert isinstance(await said.failing(locks.lock("held").info()), BackendUnavailable)
        assert isinstance(await said.failing(locks.lock("other").acquire(timeout=quick)), BackendUnavailable)

    assert len(said.errors) >= 6
    for text in said.texts():
        assert not leaks(text), (leaks(text), text)


@pytest.mark.anyio
async def test_a_memory_client_says_its_faults_in_words(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynclock")
    said = Said(caplog)
    async with virtual_clock(), asynclock.connect("memory://", ttl=30, prefix="words-memory") as locks:
        chaos = faults(locks)
        with chaos.unavailable():
            await said.failing(locks.lock("x").acquire(timeout=5))
            await said.failing(locks.lock("x").info())
        lease = await locks.lock("held").acquire(detached=True)
        chaos.stall_renewals()
        await said.failing(lease.wait_lost(), within=120)
        said.notes.append(lease.lost_reason or "")
        chaos.restore()
    assert len(said.errors) == 2
    [reason] = said.notes
    # (the keeper's answer to the hung renewal, or the deadline itself, whichever the loop runs
    # first at that instant: either says why in words)
    assert reason.startswith(
        ("could not renew before the trusted deadline: ", "the trusted deadline passed without a renewal (")
    ), reason
    assert reason.rstrip()[-1] != ":", reason
    for text in said.texts():
        assert not leaks(text), (leaks(text), text)


# -- each failure logged once --------------------------------------------------------------------------


def logged(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """How many times each line at INFO or above was logged."""
    return Counter(record.getMessage() for record in caplog.records if record.levelno >= logging.INFO)


def assert_each_once(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    lines = logged(caplog)
    assert lines and all(count == 1 for count in lines.values()), lines
    return lines


def lines_with(lines: Counter[str], *words: str) -> list[str]:
    return [line for line in lines if all(word in line for word in words)]


@pytest.mark.anyio
async def test_a_loss_a_failing_renewal_and_a_failed_release_are_each_logged_once_on_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="asynclock")
    async with virtual_clock(), asynclock.connect("memory://", ttl=30, prefix="once-memory") as locks:
        chaos = faults(locks)
        # lost
        with pytest.raises(LockLost):
            async with locks.lock("taken"):
                chaos.lose("taken")
                await asyncio.sleep(3600)
        # renewals that keep failing (one at risk, then a retry every few seconds), then lost
        lease = await locks.lock("unrenewed").acquire(detached=True)
        with chaos.unavailable():
            await lease.wait_lost()
        # a release that fails at the end of the block, then is retried in the background
        async with locks.lock("unreleased"):
            chaos.unavailable()
        await asyncio.sleep(120)  # past the background retries' end: the hold expired by itself
        chaos.restore()
    lines = assert_each_once(caplog)
    assert len(lines_with(lines, "'taken' lost")) == 1
    assert len(lines_with(lines, "'unrenewed' at risk", "a renewal failed")) == 1
    assert len(lines_with(lines, "'unrenewed' lost")) == 1
    assert len(lines_with(lines, "release of 'unreleased' failed")) == 1
    assert not lines_with(lines, "could not release 'unreleased'")  # the background retries said nothing more
    retries = [r for r in caplog.records if "renewal of 'unrenewed' failed, retrying" in r.getMessage()]
    assert len(retries) >= 2  # it was retried, and said so at DEBUG


@pytest.mark.anyio
async def test_a_killed_redis_server_is_logged_once_for_each_failure(
    redis_fresh: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed under a held lock, a lock whose block ends meanwhile, and a waiter (the
    client's pub/sub connection keeps trying to come back)."""
    caplog.set_level(logging.DEBUG, logger="asynclock")
    url, ttl = redis_fresh.url, scaled(1.5)
    async with asynclock.connect(url, ttl=ttl, connect_timeout=scaled(0.5), prefix="once") as locks:
        await locks.lock("contended").acquire(detached=True)
        waiter = asyncio.create_task(locks.lock("contended").acquire())  # (another task: another owner)
        entered, leave = asyncio.Event(), asyncio.Event()

        async def hold(name: str, until: asyncio.Event | None) -> None:
            async with locks.lock(name):
                entered.set()
                await (until.wait() if until is not None else asyncio.sleep(3600))

        held = asyncio.create_task(hold("held", None))
        await entered.wait()
        entered.clear()
        unreleased = asyncio.create_task(hold("unreleased", leave))
        await entered.wait()
        await asyncio.sleep(scaled(0.3))  # the waiter is queued and listening
        redis_fresh.kill()
        leave.set()  # the block ends: its release cannot reach the server
        with pytest.raises(LockLost):
            await held
        await unreleased  # (the release's failure is logged, not raised)
        with pytest.raises(BackendUnavailable):
            await waiter
        await asyncio.sleep(3 * ttl)  # the background retries of the release end meanwhile
    lines = assert_each_once(caplog)
    assert len(lines_with(lines, "'held' at risk")) == 1
    assert len(lines_with(lines, "'held' lost")) == 1
    assert len(lines_with(lines, "release of 'unreleased' failed")) == 1
    assert not lines_with(lines, "could not release 'unreleased'")
    reconnects = [r for r in caplog.records if "pub/sub connection lost, reconnecting" in r.getMessage()]
    assert len(reconnects) >= 3, reconnects  # it kept trying, saying each reason once at INFO
