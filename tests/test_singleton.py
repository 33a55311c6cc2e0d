"""Singleton jobs (``@locks.singleton``): on memory:// in one process, then on
ZooKeeper, Redis, PostgreSQL and etcd across four processes whose schedules
are skewed.

A call runs the job here unless another run holds its lock (running, or
started less than ``at_least`` ago); ``at_most`` cancels a run that lasts
longer and frees the lock; an exception propagates to the caller that ran
it; each call emits ``ran`` or ``skipped``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import asynclock
import asynclock.testing
from tests.harnesses import MemoryHarness, insides
from tests.servers import scaled

pytestmark = pytest.mark.anyio

AT_LEAST = scaled(0.4)


@pytest.fixture
async def mem() -> AsyncIterator[MemoryHarness]:
    harness = MemoryHarness()
    async with harness:
        yield harness
        # a job's lock outlives its client until at_least has passed: wait for that, bounded
        for locks in insides.clients_of(harness):
            await locks.aclose()
        async with asyncio.timeout(scaled(5)):
            while await harness.leftovers():
                await asyncio.sleep(0.02)


async def test_a_job_runs_once_per_at_least_window(mem: MemoryHarness) -> None:
    events: list[asynclock.LockEvent] = []
    a, b = mem.connect(ttl=scaled(5), on_event=events.append), mem.connect(ttl=scaled(5))
    runs: list[str] = []

    def job_of(locks: asynclock.Locks, who: str) -> asynclock.Singleton[[int], int]:
        @locks.singleton("report", at_most=scaled(10), at_least=AT_LEAST)
        async def report(x: int) -> int:
            runs.append(who)
            return x * 2

        return report

    on_a, on_b = job_of(a, "a"), job_of(b, "b")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await on_a(21) == 42
    # the job ended at once, but it started less than at_least ago: skipped everywhere
    assert await on_b(1) is None
    run = await on_a.attempt(1)
    assert (run.ran, run.value, run.token) == (False, None, None)
    assert runs == ["a"]
    # the lock is held until at_least after the start, then free
    assert (await b.lock("report").info()).held
    while not (loop.time() - started >= AT_LEAST and not (await b.lock("report").info()).held):
        assert loop.time() - started < AT_LEAST + scaled(2), "the lock was not freed after at_least"
        await asyncio.sleep(0.01)
    run = await on_b.attempt(5)
    assert (run.ran, run.value) == (True, 10) and run.token is not None
    assert runs == ["a", "b"]
    assert on_a.__name__ == "report" and on_a.name == "report"
    await asyncio.sleep(0)  # (events are delivered from the loop)
    kinds = [event.kind for event in events if event.name == "report" and event.kind in ("ran", "skipped")]
    assert kinds == ["ran", "skipped"]
    ran = next(event for event in events if event.kind == "ran")
    assert ran.held_s is not None and ran.held_s < AT_LEAST and ran.reason is None and ran.token is not None
    skipped = next(event for event in events if event.kind == "skipped")
    assert skipped.token is None and "at_least" in (skipped.reason or "")


async def test_concurrent_calls_run_the_job_once(mem: MemoryHarness) -> None:
    clients = [mem.connect(ttl=scaled(5)) for _ in range(4)]
    running = 0
    most = 0
    ran = 0

    async def body() -> None:
        nonlocal running, most, ran
        running += 1
        ran += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1

    jobs = [locks.singleton("job", at_most=scaled(5))(body) for locks in clients]
    results = await asyncio.gather(*(job.attempt() for job in jobs for _ in range(3)))
    assert sum(result.ran for result in results) == 1 == ran == most


async def test_at_most_cancels_the_job_and_frees_the_lock(mem: MemoryHarness) -> None:
    events: list[asynclock.LockEvent] = []
    locks = mem.connect(ttl=scaled(5), on_event=events.append)
    cleaned: list[str] = []

    @locks.singleton("slow", at_most=0.1, at_least=0.1)
    async def slow() -> None:
        try:
            await asyncio.sleep(scaled(30))
        finally:
            cleaned.append("cancelled")

    with pytest.raises(TimeoutError, match="at_most"):
        await asyncio.wait_for(slow(), scaled(5))
    assert cleaned == ["cancelled"]
    assert not (await locks.lock("slow").info()).held, "cut off by at_most, the lock is free at once"
    await asyncio.sleep(0)
    ran = next(event for event in events if event.kind == "ran")
    assert "at_most" in (ran.reason or "")


async def test_an_exception_of_the_job_propagates_and_at_least_still_holds(mem: MemoryHarness) -> None:
    locks = mem.connect(ttl=scaled(5))

    @locks.singleton("flaky", at_most=scaled(5), at_least=AT_LEAST)
    async def flaky() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await flaky()
    assert await flaky.attempt() == asynclock.JobRun(False, None, None)


async def test_a_lost_lock_cancels_the_job_with_lock_lost(mem: MemoryHarness) -> None:
    locks = mem.connect(ttl=scaled(5))
    chaos = asynclock.testing.faults(locks)

    @locks.singleton("doomed", at_most=scaled(30))
    async def doomed() -> None:
        chaos.lose("doomed")
        await asyncio.sleep(scaled(30))

    with pytest.raises(asynclock.LockLost):
        await asyncio.wait_for(doomed(), scaled(5))


async def test_a_client_closed_during_at_least_leaves_the_hold_until_at_least(mem: MemoryHarness) -> None:
    """A replica that shuts down right after a run must not let another run it again
    before at_least: the hold stays on the server (here memory://'s table) until then,
    though its ttl is shorter, and nothing is left running in the closed client."""
    locks, other = mem.connect(ttl=scaled(0.3)), mem.connect(ttl=scaled(0.3))
    at_least = scaled(1.0)

    @locks.singleton("tail", at_most=scaled(60), at_least=at_least)
    async def tail() -> str:
        return "done"

    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await tail() == "done"
    assert insides.pending_timers(locks), "the release at at_least is due later"
    await locks.aclose()
    assert not insides.pending_timers(locks)
    again = other.singleton("tail", at_most=scaled(60))(tail.__wrapped__)  # type: ignore[attr-defined]
    while loop.time() - started < at_least * 0.9:
        assert not (await again.attempt()).ran, f"ran again {loop.time() - started:.2f}s after the start"
        await asyncio.sleep(0.05)
    await asyncio.sleep(at_least * 0.1 + scaled(0.1))
    assert (await again.attempt()).ran, "free after at_least"


async def test_bounds_are_checked_before_any_io(mem: MemoryHarness) -> None:
    locks = mem.connect(ttl=scaled(5))
    with pytest.raises(ValueError, match="must not be more than at_most"):
        locks.singleton("j", at_most=1, at_least=2)
    with pytest.raises(ValueError, match="more than 0"):
        locks.singleton("j", at_most=0)
    with pytest.raises(ValueError):
        locks.singleton("j", at_most=1, at_least=-1)
    with pytest.raises(TypeError):
        locks.singleton("j", at_most="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        locks.singleton("", at_most=1)


async def test_otel_metrics_count_runs_and_skips(mem: MemoryHarness) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from asynclock.otel import OtelMetrics

    reader = InMemoryMetricReader()
    locks = mem.connect(ttl=scaled(5), on_event=OtelMetrics(MeterProvider(metric_readers=[reader])))

    @locks.singleton("metered", at_most=scaled(5), at_least=AT_LEAST)
    async def metered(fail: bool) -> None:
        if fail:
            raise RuntimeError("boom")

    await metered(False)
    await metered(False)  # skipped: within at_least
    await asyncio.sleep(AT_LEAST + 0.05)
    with pytest.raises(RuntimeError):
        await metered(True)
    await asyncio.sleep(0)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    ran = {p.attributes["outcome"]: p.value for p in points["asynclock.jobs.ran"]}  # type: ignore[attr-defined]
    assert ran == {"ok": 1, "failed": 1}
    assert sum(p.value for p in points["asynclock.jobs.skipped"]) == 1  # type: ignore[attr-defined]
    assert sum(p.count for p in points["asynclock.job.duration"]) == 2  # type: ignore[attr-defined]


# -- four processes, skewed schedules ------------------------------------------------

SCHEDULER = """
import asyncio, json, sys, time
import asynclock
import asynclock.testing

url, prefix, out, skew, period, at_least, rounds = sys.argv[1:8]
skew, period, at_least, rounds = float(skew), float(period), float(at_least), int(rounds)

async def main():
    async with asynclock.connect(url, prefix=prefix, ttl=3) as locks:
        @locks.singleton("tick", at_most=period, at_least=at_least)
        async def tick(k):
            with open(out, "a") as f:
                f.write(json.dumps({"k": k, "t": time.monotonic(), "pid": __import__("os").getpid()}) + "\\n")
        await locks.lock("warm-up").info()  # connected
        print("started", flush=True)
        start = float(sys.stdin.readline())
        for k in range(rounds):
            await asyncio.sleep(max(0.0, start + k * period + skew - time.monotonic()))
            await tick(k)
        print("done", flush=True)
        sys.stdin.readline()  # replicas live on (a ZooKeeper hold ends with its client's session)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "server", ["zookeeper_server", "redis_server", "postgres_server", "etcd_server", "mysql_server"]
)
async def test_four_processes_with_skewed_schedules_run_it_once_per_window(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each process calls the job every ``period`` seconds, its schedule skewed by up to 0.3
    period from the others' (less than at_least): every period, exactly one of them runs it."""
    url = request.getfixturevalue(server).url
    period, at_least, rounds = scaled(1.0), scaled(0.6), 4
    skews = [0.0, 0.1 * period, 0.3 * period, 0.2 * period]
    out = tmp_path / "runs.jsonl"
    prefix = f"sg{time.monotonic_ns() % 10**9}"
    procs = await asyncio.gather(
        *(
            asyncio.create_subprocess_exec(
                *(sys.executable, "-c", SCHEDULER, url, prefix, str(out)),
                *(str(skew), str(period), str(at_least), str(rounds)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
            )
            for skew in skews
        )
    )
    try:
        async with asyncio.timeout(scaled(60)):
            for proc in procs:
                assert proc.stdout is not None
                assert (await proc.stdout.readline()).strip() == b"started"
            start = time.monotonic() + 0.2
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{start}\n".encode())
                await proc.stdin.drain()
            for proc in procs:
                assert proc.stdout is not None
                assert (await proc.stdout.readline()).strip() == b"done"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"exit\n")
                await proc.stdin.drain()
                assert await proc.wait() == 0
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(run["k"] for run in runs) == list(range(rounds)), f"not exactly one run per period: {runs}"
    starts = sorted(run["t"] for run in runs)
    assert all(later - earlier >= at_least for earlier, later in itertools.pairwise(starts))
