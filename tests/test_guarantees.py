"""``locks.guarantees`` and ``connect(url, require=...)``: the one table, what each backend claims
in it, and the documentation's copy of it.

The table (``asynclock/_guarantees.py``) says, per configuration, which words a
backend claims and names the tests that back each claim. Here:

* every configuration ``connect`` builds reads its own row, and ``require``
  refuses what a row lacks before any I/O;
* every test a claim names exists;
* on a real server of each configuration, the claims that a short test can
  show hold (``fencing``, ``fifo``, ``reentrant``, ``notifications``), and
  where a word is not claimed the backend behaves as the table says
  (no token, no fair lock);
* the table in ``docs/testing.md`` is the one the code renders.
"""

from __future__ import annotations

import ast
import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import asynclock
from asynclock import ConfigurationError
from asynclock._guarantees import BEGIN, END, TABLE, WORDS, render, replace_in
from asynclock.testing.conformance import Contract, ServerContract
from tests.conftest import make_harness
from tests.harnesses import Harness, RedisHarness
from tests.servers import RedisServer, scaled
from tests.test_redis_replicas import _wait_for_link

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "testing.md"
TTL = scaled(0.6)

#: What connect builds for each kind of URL: the row of the table it reads.
URLS = {
    "memory://": "memory",
    "redis://127.0.0.1:1/0": "redis",
    "unix:///nowhere/redis.sock": "redis",
    "redis://127.0.0.1:1/0?replicas=1": "redis+replicas",
    "redis+sentinel://127.0.0.1:1/mymaster": "redis+sentinel",
    "redis+sentinel://127.0.0.1:1/mymaster?replicas=2": "redis+sentinel+replicas",
    "redis+cluster://127.0.0.1:1": "redis+cluster",
    "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3": "redlock",
    "zk://127.0.0.1:1/app": "zookeeper",
    "etcd://127.0.0.1:1": "etcd",
    "postgresql://app@127.0.0.1:1/db": "postgres",
    "mysql://app@127.0.0.1:1/db": "mysql",
    "mariadb://app@127.0.0.1:1/db": "mysql",
}


# -- the table and connect -----------------------------------------------------------


@pytest.mark.parametrize("url", list(URLS))
def test_each_configuration_reads_its_row(url: str) -> None:
    locks = asynclock.connect(url)
    assert locks.guarantees == TABLE[URLS[url]].words
    assert isinstance(locks.guarantees, frozenset)


def test_every_row_is_built_by_some_url_and_uses_only_the_words() -> None:
    assert set(URLS.values()) == set(TABLE)
    for row in TABLE.values():
        assert row.words <= WORDS.keys()
        assert set(row.notes) <= WORDS.keys()
        assert set(row.tests) == row.words, f"{row.title}: each word claimed names its tests, and only those"


def test_a_backend_object_without_a_declaration_guarantees_nothing() -> None:
    class Bare:
        scheme = "bare"

    assert asynclock.Locks(Bare()).guarantees == frozenset()  # type: ignore[arg-type]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that accepts connections, so a test can tell whether anything connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(scaled(0.3))
    try:
        yield server
    finally:
        server.close()


def _nothing_connected(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


@pytest.mark.parametrize(
    ("scheme", "require", "lacking"),
    [
        ("redlock://127.0.0.1:{port},127.0.0.1:{port},127.0.0.1:{port}", {"fencing"}, "'fencing'"),
        ("redis://127.0.0.1:{port}/0", {"survives_failover", "fencing"}, "'survives_failover'"),
        ("postgresql://app@127.0.0.1:{port}/db", {"notifications", "session"}, "'notifications'"),
        ("redis+cluster://127.0.0.1:{port}", ["fifo"], "'fifo'"),
    ],
)
async def test_require_refuses_what_the_backend_lacks_before_any_io(
    listener: socket.socket, scheme: str, require: Any, lacking: str
) -> None:
    url = scheme.format(port=listener.getsockname()[1])
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ConfigurationError) as caught:
        asynclock.connect(url, require=require)
    assert loop.time() - started < 0.5  # at once: nothing waited for a server
    message = str(caught.value)
    assert lacking in message and "guarantees:" in message
    assert await asyncio.to_thread(_nothing_connected, listener), "connect(require=...) reached the server"


def test_require_names_the_configuration_that_has_it() -> None:
    with pytest.raises(ConfigurationError, match=r"with replicas=N .* it does"):
        asynclock.connect("redis+sentinel://127.0.0.1:1/mymaster", require={"survives_failover"})
    with pytest.raises(ConfigurationError) as caught:
        asynclock.connect("redis://127.0.0.1:1/0", require={"survives_failover", "session"})
    assert "replicas" not in str(caught.value)  # replicas= would not give a session


def test_require_passes_what_the_backend_has() -> None:
    locks = asynclock.connect("zk://127.0.0.1:1", require=set(WORDS))
    assert locks.guarantees == frozenset(WORDS)
    assert asynclock.connect("redis://127.0.0.1:1/0?replicas=1", require={"survives_failover"}).guarantees
    assert asynclock.connect("memory://", require=()).guarantees == TABLE["memory"].words


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "no-such-scheme://x"])
def test_an_unknown_word_is_a_value_error_naming_the_words_before_anything_else(url: str) -> None:
    with pytest.raises(ValueError, match="unknown guarantee 'fenced' in require; the words are: fencing, fifo"):
        asynclock.connect(url, require={"fenced"})


@pytest.mark.parametrize("require", ["fencing", b"fencing", {1}])
def test_require_takes_a_set_of_words(require: Any) -> None:
    with pytest.raises(TypeError, match="require takes"):
        asynclock.connect("memory://", require=require)


# -- every claim names tests that exist ----------------------------------------------------


def _defined(reference: str) -> bool:
    """Whether ``tests/<module>.py::[<Class>::]<test>`` names a test: a function of the module, or a
    method of the class (its own, or the conformance suite's that it inherits)."""
    path, *names = reference.split("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    if len(names) == 1:
        return any(isinstance(node, functions) and node.name == names[0] for node in tree.body)
    class_name, test = names
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            if any(isinstance(item, functions) and item.name == test for item in node.body):
                return True
            bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
            suite = ServerContract if "ServerContract" in bases else Contract if "Contract" in bases else None
            return suite is not None and callable(getattr(suite, test, None))
    return False


def test_every_claim_names_tests_that_exist() -> None:
    unknown = [
        f"{key}/{word}: {reference}"
        for key, row in TABLE.items()
        for word, references in row.tests.items()
        for reference in references
        if not _defined(reference)
    ]
    assert unknown == []


def test_the_reference_checker_tells_a_missing_test() -> None:
    assert _defined("tests/test_contract.py::TestContract::test_reentry_counts_holds_and_keeps_token")
    assert not _defined("tests/test_contract.py::TestContract::test_no_such_test")
    assert not _defined("tests/test_guarantees.py::test_no_such_test")
    assert _defined("tests/test_guarantees.py::test_fencing_claim")


# -- the documentation's copy ----------------------------------------------------------------


def test_the_docs_table_is_the_one_the_code_renders() -> None:
    page = PAGE.read_text(encoding="utf-8")
    start, end = page.find(BEGIN), page.find(END)
    assert 0 <= start < end, f"{PAGE.name} has lost the markers of the generated guarantees table"
    found = page[start : end + len(END)]
    fresh = render()
    assert found == fresh, (
        "docs/testing.md's guarantees table differs from asynclock/_guarantees.py; update it with"
        " `python -m asynclock._guarantees --write docs/testing.md`. The table now:\n\n" + fresh
    )


def test_the_writer_replaces_only_what_lies_between_the_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{BEGIN}\nold table\n{END}\n\nafter\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "asynclock._guarantees", "--write", str(page)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert page.read_text(encoding="utf-8") == f"# Title\n\nbefore\n\n{render()}\n\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        replace_in("no markers here", render())


# -- the claims, on real servers --------------------------------------------------------------

#: The configurations the claims are checked on (Sentinel runs the same code as one Redis; its
#: own claims are backed by the tests the table names).
CLAIMED = ["memory", "redis", "redis+replicas", "redis+cluster", "redlock", "zookeeper", "etcd", "postgres", "mysql"]


@pytest.fixture(scope="module")
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


class ReplicasHarness(RedisHarness):
    """One Redis primary whose acquires and renewals its replica confirms (``?replicas=1``)."""

    kind = "redis+replicas"

    @property
    def url(self) -> str:
        return f"{self.server.url}?replicas=1&replica_timeout={scaled(2)}"


@pytest.fixture(params=CLAIMED)
async def claim_harness(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Harness]]:
    """A harness for each configuration, and the row of the table it should read."""
    if request.param == "redis+replicas":
        primary, _ = request.getfixturevalue("primary_and_replica")
        harness: Harness = ReplicasHarness(primary)
    else:
        harness = make_harness(request, request.param)
    async with harness:
        yield request.param, harness


async def _client(configuration: str, harness: Harness, ttl: float = TTL) -> asynclock.Locks:
    locks = harness.connect(ttl=ttl)
    await locks.open()
    assert locks.guarantees == TABLE[configuration].words, "the client reads another row than its configuration's"
    return locks


async def test_fencing_claim(claim_harness: tuple[str, Harness]) -> None:
    configuration, harness = claim_harness
    a, b = await _client(configuration, harness), await _client(configuration, harness)
    tokens = []
    for locks in (a, b, a, b):
        async with locks.lock("fenced") as lease:
            tokens.append(lease.token)
    if "fencing" in a.guarantees:
        assert all(isinstance(token, int) for token in tokens), tokens
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    else:
        assert tokens == [None] * 4


async def test_fifo_claim(claim_harness: tuple[str, Harness]) -> None:
    configuration, harness = claim_harness
    holder = await _client(configuration, harness)
    if "fifo" not in holder.guarantees:
        with pytest.raises(NotImplementedError):
            holder.lock("line", fair=True)
        return
    lock = holder.lock("line", fair=True)
    order: list[int] = []

    async def wait_in_line(number: int, locks: asynclock.Locks) -> None:
        async with locks.lock("line", fair=True):
            order.append(number)

    await lock.acquire()
    waiters = []
    for number in range(3):
        waiters.append(asyncio.create_task(wait_in_line(number, await _client(configuration, harness))))
        async with asyncio.timeout(scaled(5)):
            while (await lock.info()).waiters != number + 1:
                await asyncio.sleep(0.01)
    await lock.release()
    await asyncio.wait_for(asyncio.gather(*waiters), scaled(10))
    assert order == [0, 1, 2]


async def test_reentrant_claim(claim_harness: tuple[str, Harness]) -> None:
    configuration, harness = claim_harness
    locks, other = await _client(configuration, harness), await _client(configuration, harness)
    assert "reentrant" in locks.guarantees  # every backend: re-entry is counted per owner task
    lock = locks.lock("again")
    outer = await lock.acquire(timeout=0)
    inner = await lock.acquire(timeout=0)  # would time out if the owner were not let in again
    assert inner is outer and inner.hold_count == 2
    await lock.release()
    with pytest.raises(asynclock.LockTimeout):
        await other.lock("again").acquire(timeout=0)  # still held once
    await lock.release()
    await other.lock("again").acquire(timeout=scaled(2))
    await other.lock("again").release()


async def test_notifications_claim(claim_harness: tuple[str, Harness]) -> None:
    """A waiter makes no request while the lock stays held (a few at most, not one per poll), and a
    release wakes it at once, long before the holder's ttl would have."""
    configuration, harness = claim_harness
    ttl = scaled(20)
    holder, waiter = await _client(configuration, harness, ttl), await _client(configuration, harness, ttl)
    if "notifications" not in holder.guarantees:
        pytest.skip(f"{configuration} does not claim notifications")
    backend = waiter.backend
    asked = 0
    for method in ("try_acquire", "wait_queued"):
        original = getattr(backend, method, None)
        if original is None:
            continue

        def counting(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            nonlocal asked
            asked += 1
            return _original(*args, **kwargs)

        setattr(backend, method, counting)
    loop = asyncio.get_running_loop()
    await holder.lock("bell").acquire()
    waiting = asyncio.create_task(waiter.lock("bell").acquire(detached=True))
    await asyncio.sleep(scaled(3))
    assert not waiting.done()
    # (one try, and at most two waits: one that subscribes, one that waits; a poll each second makes more)
    assert asked <= 3, f"the waiter asked the server {asked} times in {scaled(3):g} s: it polls"
    released = loop.time()
    await holder.lock("bell").release()
    lease = await asyncio.wait_for(waiting, ttl / 2)
    assert loop.time() - released < scaled(1.5), "the release did not wake the waiter"
    await lease.release()
