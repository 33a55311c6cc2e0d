"""Fixtures: real servers (session-scoped) and one harness per backend.

The contract suite runs every test once per backend listed in ``BACKENDS``;
each harness gives a fresh key prefix (isolation), ways to connect, and the
faults that backend supports (expire a hold server-side, pause the server,
drop connections).
"""

from __future__ import annotations

import gc
import importlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.harnesses import Harness
from tests.servers import RedisServer
from tests.servers.etcd import EtcdServer
from tests.servers.mysql import MariaDBServer
from tests.servers.postgres import PostgresServer
from tests.servers.redis_topologies import ClusterSetup, RedisNodes
from tests.servers.zookeeper import ZooKeeperServer

BACKENDS = ["memory", "redis", "postgres", "zookeeper", "redlock", "etcd", "mysql"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run the long torture tests too")


#: With ``--dist loadfile`` (tests/run.sh) a test module runs on one worker, which
#: makes its module-scoped fixtures (a build, a Sentinel group of five servers)
#: once; each worker starts the session servers its modules use. These modules are
#: exceptions to that rule (see ``pytest_xdist_make_scheduler``):
#: the longest ones, whose tests go one by one to whichever worker is free (each of
#: those starts the module's servers: a few seconds, against minutes of waiting
#: on one worker; the SPIN models' runs need no server at all);
SPREAD_MODULES = {"test_faults.py", "test_models.py"}
#: and those that use the machine's DNS resolver, which run one after another on one
#: worker: the config tests look up names that do not resolve (a client retries such
#: a lookup until its connect timeout) and the packaging test installs from the
#: package index. The resolver leaves one lookup in a few dozen unanswered for 5 s,
#: its timeout; with lookups from other workers in between, a config test's first
#: lookup can be that one, and its error then says "timed out" where the test
#: checks for "name not resolved".
SHARED_GROUPS = dict.fromkeys(
    ["test_redis_config.py", "test_postgres_config.py", "test_zookeeper_config.py", "test_package.py"], "dns"
)


def work_unit(nodeid: str) -> str:
    """What runs on one worker with ``--dist loadfile``: the test's module, with the exceptions above."""
    module = nodeid.split("::", 1)[0]
    name = module.rpartition("/")[2]
    if name in SPREAD_MODULES:
        return nodeid
    return SHARED_GROUPS.get(name, module)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the work units of ``work_unit``. (pytest-xdist's own
    ``xdist_group`` marks do not group on pytest 9: it renames ``item._nodeid``,
    which pytest 9 no longer reads.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow") or os.environ.get("ASYNCLOCK_SLOW"):
        return
    skip = pytest.mark.skip(reason="torture test: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what collection made (every worker collects the whole suite) out of the
    garbage collector's walks: each test's hygiene check collects after it, and a full
    walk of that heap took 0.1 to 0.4 s per test. What the tests make is still collected."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _hygiene(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test: no pending asynclock task, no "Task exception was never
    retrieved", and the session redis-server, ZooKeeper and PostgreSQL back to
    their client connection counts (MariaDB's too)."""
    from tests.faults import hygiene

    if "anyio_backend" in request.fixturenames:
        request.getfixturevalue("_no_pending_asynclock_tasks")
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    # The backend of any harness fixture ("redis", or "redis/fair" in the primitives' runs).
    backend = next(
        (value.split("/")[0] for key, value in params.items() if key.endswith("harness") and isinstance(value, str)),
        None,
    )
    counters: dict[str, Callable[[], int]] = {}
    if "redis_server" in request.fixturenames or backend == "redis":
        url = request.getfixturevalue("redis_server").url
        counters["redis-server"] = lambda: hygiene.redis_connections(url)
    if "zookeeper_server" in request.fixturenames or backend == "zookeeper":
        port = request.getfixturevalue("zookeeper_server").port
        counters["ZooKeeper"] = lambda: hygiene.zookeeper_connections(port)
    if "postgres_server" in request.fixturenames or backend == "postgres":
        dsn = request.getfixturevalue("postgres_server").dsn
        counters["PostgreSQL"] = lambda: hygiene.postgres_connections(dsn)
    if "mysql_server" in request.fixturenames or backend == "mysql":
        mysql = request.getfixturevalue("mysql_server")
        counters["MariaDB"] = lambda: hygiene.mysql_connections(mysql)
    baselines = {name: count() for name, count in counters.items()}
    with hygiene.NeverRetrieved() as never_retrieved:
        yield
    problems = [f"asyncio: {found}" for found in never_retrieved.found]
    for name, count in counters.items():
        now = hygiene.wait_connections(count, baselines[name])
        if now > baselines[name]:
            problems.append(f"{name} has {now} client connections after the test, {baselines[name]} before")
    if problems:
        pytest.fail("hygiene: " + "; ".join(problems))


@pytest.fixture
async def _no_pending_asynclock_tasks() -> AsyncIterator[None]:
    """Set up before the test's other async fixtures, so it checks after their teardown."""
    from tests.faults import hygiene

    yield
    left = await hygiene.pending_asynclock_tasks()
    if left:
        pytest.fail(f"hygiene: asynclock tasks still pending after the test: {left}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_fresh() -> Iterator[RedisServer]:
    """A redis-server of its own, for tests that kill, pause or restart it."""
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session (initdb'ed into a temp dir); tests isolate by prefix."""
    server = PostgresServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def mysql_server() -> Iterator[MariaDBServer]:
    """One MariaDB for the session (installed into a temp dir); tests isolate by prefix."""
    server = MariaDBServer()
    server.start(timeout=60)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper (100 ms tick) for the session; tests isolate by prefix."""
    server = ZooKeeperServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One single-member etcd for the session; tests isolate by prefix."""
    server = EtcdServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def redlock_nodes() -> Iterator[RedisNodes]:
    """Five independent redis-servers for the session's Redlock contract tests."""
    nodes = RedisNodes(5)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.cleanup()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterSetup]:
    """A Redis Cluster of three primaries for the session (tests that kill a node make their own)."""
    setup = ClusterSetup(3)
    try:
        setup.start()
        yield setup
    finally:
        setup.cleanup()


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


#: Each backend's harness: the module and class under tests/harnesses/, and the session
#: fixture of the server it runs on (None: no server). A new backend is one row here.
HARNESSES: dict[str, tuple[str, str, str | None]] = {
    "memory": ("tests.harnesses", "MemoryHarness", None),
    "redis": ("tests.harnesses", "RedisHarness", "redis_server"),
    "postgres": ("tests.harnesses.postgres", "PostgresHarness", "postgres_server"),
    "zookeeper": ("tests.harnesses.zookeeper", "ZooKeeperHarness", "zookeeper_server"),
    "etcd": ("tests.harnesses.etcd", "EtcdHarness", "etcd_server"),
    "mysql": ("tests.harnesses.mysql", "MySQLHarness", "mysql_server"),
    "redlock": ("tests.harnesses.redlock", "RedlockHarness", "redlock_nodes"),
    "redis+cluster": ("tests.harnesses.cluster", "ClusterHarness", "redis_cluster"),
}


def make_harness(request: pytest.FixtureRequest, kind: str) -> Harness:
    """A fresh harness for the backend ``kind``, on the session's servers."""
    module, name, server = HARNESSES[kind]
    harness_type = getattr(importlib.import_module(module), name)
    harness: Harness = harness_type() if server is None else harness_type(request.getfixturevalue(server))
    return harness
