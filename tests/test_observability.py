"""Events, OpenTelemetry metrics, logging, and ``asynclock inspect`` run as
a command against a lock held by another process."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import asynclock
from asynclock.backends import memory
from asynclock.otel import OtelMetrics
from tests.servers import RedisServer, scaled
from tests.servers.redis_topologies import RedisNodes

TTL = scaled(0.6)

HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import asynclock

    async def main(url, prefix):
        async with asynclock.connect(url, ttl=30, prefix=prefix) as locks:
            lock = locks.lock("jobs:nightly")
            async with lock:
                async with lock:  # re-entered: hold count 2
                    print("held", flush=True)
                    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


SERVER_BACKENDS = ["redis", "redlock", "zookeeper", "postgres", "mysql"]


@pytest.fixture(params=SERVER_BACKENDS)
def server_url(request: pytest.FixtureRequest) -> str:
    kind = request.param
    fixture = {
        "redis": "redis_server",
        "redlock": "redlock_nodes",
        "zookeeper": "zookeeper_server",
        "postgres": "postgres_server",
        "mysql": "mysql_server",
    }[kind]
    return str(request.getfixturevalue(fixture).url)


@pytest.fixture
def held_elsewhere(server_url: str) -> Iterator[tuple[str, str]]:
    """A lock held (twice) by another process until the test ends."""
    prefix = f"inspect{secrets.token_hex(3)}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, server_url, prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "held"
    yield server_url, prefix
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asynclock", "inspect", *args], capture_output=True, text=True, timeout=60
    )


def test_inspect_shows_a_lock_held_by_another_process(held_elsewhere: tuple[str, str]) -> None:
    url, prefix = held_elsewhere
    done = _inspect(url, "jobs:nightly", "free-one", "--prefix", prefix, "--json")
    assert done.returncode == 0, done.stderr
    held, free = json.loads(done.stdout)
    assert held["name"] == "jobs:nightly" and held["held"]
    assert held["owner"]
    assert held["hold_count"] >= 1  # the holder's own client counts re-entries; others may see 1
    assert held["ttl"] is None or 0 < held["ttl"] <= 30
    if not url.startswith("redlock"):
        assert isinstance(held["token"], int)
    assert held["key"]
    assert free["owner"] is None and not free["held"]

    listed = _inspect(url, "--prefix", prefix)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.strip().splitlines()
    assert header.split()[:4] == ["NAME", "HOLDER", "HOLDS", "TTL"]
    assert row.split()[0] == "jobs:nightly"


def test_inspect_shows_the_hold_count_kept_on_redis(redis_server: RedisServer) -> None:
    prefix = f"inspect{secrets.token_hex(3)}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_server.url, prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "held"
        done = _inspect(redis_server.url, "jobs:nightly", "--prefix", prefix, "--json")
        assert done.returncode == 0, done.stderr
        (held,) = json.loads(done.stdout)
        assert held["hold_count"] == 2
        assert held["key"] == f"{prefix}:{{jobs:nightly}}:x"  # the plain lock (the fair lock too)
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_inspect_reports_errors_with_a_status(redis_server: RedisServer) -> None:
    done = _inspect("mssql://nowhere/db", "x")
    assert done.returncode == 1 and "scheme" in done.stderr
    done = _inspect(redis_server.url, "--prefix", "nothing-here-at-all")
    assert done.returncode == 0 and done.stdout.strip() == "no locks held"


@pytest.mark.anyio
async def test_otel_metrics_count_and_time_what_happens() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    prefix = "otel"
    async with asynclock.connect("memory://", ttl=TTL, prefix=prefix, on_event=OtelMetrics(provider)) as locks:
        lock = locks.lock("m")
        async with lock:
            await asyncio.sleep(0.01)
            with pytest.raises(asynclock.LockTimeout):
                await asyncio.create_task(lock.acquire(timeout=0))
        lease = await lock.acquire()
        memory.expire("m", prefix=prefix)
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        await asyncio.create_task(lock.acquire())  # a task that ends holding it: abandoned
        await asyncio.sleep(0.01)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[object]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)

    def total(name: str) -> float:
        return sum(p.value for p in points[name])  # type: ignore[attr-defined]

    assert total("asynclock.acquisitions") == 3
    assert total("asynclock.timeouts") == 1
    assert total("asynclock.releases") == 1
    assert total("asynclock.losses") == 1
    assert total("asynclock.abandoned") == 1
    (loss,) = points["asynclock.losses"]
    assert loss.attributes["reason"] == "taken_or_expired"  # type: ignore[attr-defined]
    waits = points["asynclock.wait.duration"]
    assert sum(p.count for p in waits) == 4  # type: ignore[attr-defined]
    holds = points["asynclock.hold.duration"]
    assert sum(p.count for p in holds) == 3  # type: ignore[attr-defined]
    assert all(p.attributes.get("lock.name") == "m" for p in holds)  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_loss_is_a_warning_with_the_reason_and_renewals_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asynclock")
    async with asynclock.connect("memory://", ttl=TTL, prefix="logs") as locks:
        lease = await locks.lock("l").acquire()
        await asyncio.sleep(TTL / 2)  # a renewal
        memory.expire("l", prefix="logs")
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "asynclock"]
    assert len(warnings) == 1 and "'l' lost" in warnings[0].getMessage()
    assert "no longer has this hold" in warnings[0].getMessage()
    renewals = [r for r in caplog.records if "renewed" in r.getMessage()]
    assert renewals and all(r.levelno == logging.DEBUG for r in renewals)


@pytest.mark.anyio
async def test_event_callbacks_run_from_the_loop_after_the_fact() -> None:
    calls: list[str] = []

    def callback(event: asynclock.LockEvent) -> None:
        calls.append(event.kind)

    async with asynclock.connect("memory://", ttl=TTL, prefix="cbs", on_event=callback) as locks:
        async with locks.lock("c"):
            assert calls == []  # delivered later from the loop, not inside acquire
        await asyncio.sleep(0)
        assert calls[:2] == ["acquired", "released"]


PRIMITIVE_HOLDER = """
import asyncio, sys
import asynclock

async def main() -> None:
    async with asynclock.connect(sys.argv[1], prefix=sys.argv[2], ttl=30) as locks:
        held = asyncio.Event()
        done = asyncio.Event()

        async def hold(handle) -> None:
            async with handle:
                held.set()
                await done.wait()

        tasks = [
            asyncio.create_task(hold(locks.semaphore("gpu", permits=3))),
            asyncio.create_task(hold(locks.semaphore("gpu", permits=3))),
            asyncio.create_task(hold(locks.rw_lock("catalog").read)),
        ]
        while (await locks.semaphore("gpu", permits=3).info()).holders.__len__() < 2:
            await asyncio.sleep(0.01)
        print("held", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        done.set()
        await asyncio.gather(*tasks)

asyncio.run(main())
"""


def test_inspect_shows_every_holder_of_a_semaphore_and_a_read_lock(redis_server: RedisServer) -> None:
    prefix = f"inspect{secrets.token_hex(3)}"
    proc = subprocess.Popen(
        [sys.executable, "-c", PRIMITIVE_HOLDER, redis_server.url, prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "held"
        done = _inspect(redis_server.url, "gpu", "--kind", "semaphore", "--prefix", prefix, "--json")
        assert done.returncode == 0, done.stderr
        (sem,) = json.loads(done.stdout)
        assert len(sem["holders"]) == 2 and sem["owner"] in sem["holders"]
        table = _inspect(redis_server.url, "gpu", "--kind", "semaphore", "--prefix", prefix)
        assert table.returncode == 0, table.stderr
        assert "(+1 more)" in table.stdout.splitlines()[1]
        rw = _inspect(redis_server.url, "catalog", "--kind", "rw", "--prefix", prefix, "--json")
        assert rw.returncode == 0, rw.stderr
        assert len(json.loads(rw.stdout)[0]["holders"]) == 1
        # the plain lock of the same name is another thing: free
        plain = _inspect(redis_server.url, "gpu", "--prefix", prefix, "--json")
        assert json.loads(plain.stdout)[0]["owner"] is None
        # listing needs names for primitives
        listing = _inspect(redis_server.url, "--kind", "fair", "--prefix", prefix)
        assert listing.returncode == 1 and "name them" in listing.stderr
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_inspect_refuses_a_primitive_the_backend_lacks(redlock_nodes: RedisNodes) -> None:
    done = _inspect(redlock_nodes.url, "x", "--kind", "semaphore")
    assert done.returncode == 1
    assert "does not provide a semaphore" in done.stderr
