"""Run the scenarios, check the targets, write the table, the JSON and the chart.

``python -m benchmarks [--quick] [--backends memory,redis,zookeeper,postgres,etcd]
[--no-peers] [--scenarios uncontended,contended,herd,watchdog] [--out DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import contextlib
import dataclasses
import datetime as dt
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import report
from .servers import PG_WORK_SQL, Servers, process_tree_cpu, server_counter, started
from .subjects import BEFORE_ENV, BY_KEY, PEERS, SUBJECTS, Subject, add_before, async_client, thread_client
from .workload import (
    Counter,
    contention_metrics,
    install_asyncmy_counter,
    install_asyncpg_counter,
    install_redis_counter,
    percentile,
    run_contended,
)

BACKENDS = ["memory", "redis", "zookeeper", "postgres", "mysql", "etcd"]
SCENARIOS = ["uncontended", "contended", "herd", "watchdog", "connections", "election"]


@dataclass(frozen=True)
class Plan:
    iterations: int  # uncontended acquire+release pairs per subject (over all rounds)
    rounds: int  # subjects take turns this many times (noise hits all alike)
    warmup: int
    workers: int
    procs: int
    window: float  # contended run length, seconds
    hold: float
    herd: tuple[int, int]
    herd_window: float
    watchdog: tuple[int, ...]
    watchdog_ttl: float
    watchdog_periods: int
    repeats: int  # contended runs per subject, in passes over all subjects; the best by throughput is kept
    terms: int  # leader hand-overs by resign measured per backend and ttl
    election_ttls: tuple[float, ...]
    closes: int  # leader hand-overs by a drained close measured per backend and ttl


FULL = Plan(2000, 5, 50, 8, 4, 2.5, 0.001, (8, 64), 1.5, (1000, 10000), 3.0, 3, 2, 200, (2.0, 10.0), 100)
QUICK = Plan(100, 2, 10, 8, 2, 0.6, 0.001, (8, 32), 0.5, (1000,), 1.5, 2, 1, 20, (2.0,), 10)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds (numbers are not meaningful)")
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when a target measured in this run is missed"
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, from %(default)s")
    parser.add_argument("--no-peers", action="store_true", help="asynclock and the raw floors only")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from %(default)s")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="where to write results")
    parser.add_argument("--procs", type=int, help="processes the contended and herd workers are spread over")
    parser.add_argument("--window", type=float, help="seconds each contended run lasts")
    parser.add_argument(
        "--before", metavar="REV", help="also measure asynclock at the git revision REV, and compare it with this tree"
    )
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for backend in args.backends:
        if backend not in BACKENDS:
            parser.error(f"unknown backend {backend!r}")
    for scenario in args.scenarios:
        if scenario not in SCENARIOS:
            parser.error(f"unknown scenario {scenario!r}")
    return args


def add_revision(rev: str) -> str:
    """Measure asynclock at ``rev`` too: a copy of its package, importable as ``asynclock_before``."""
    root = Path(__file__).resolve().parent.parent
    where = tempfile.mkdtemp(prefix="asynclock-before-")
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    archive = subprocess.run(["git", "archive", rev, "asynclock"], cwd=root, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    os.rename(os.path.join(where, "asynclock"), os.path.join(where, "asynclock_before"))
    short = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    os.environ[BEFORE_ENV] = f"{where}\n{short}"  # the worker processes read it when they import the subjects
    added = add_before(where, short)
    log(f"also measuring asynclock at {short}: {', '.join(s.key for s in added) or 'no backend'}")
    return short


def machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    libs: dict[str, str | None] = {}
    for dist in ("asynclock", "redis", "python-redis-lock", "pottery", "aiozk", "kazoo", "asyncpg", "grpcio"):
        try:
            libs[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            libs[dist] = None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg": os.getloadavg(),
        "libraries": libs,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.procs:
        plan = dataclasses.replace(plan, procs=args.procs)
    if args.window:
        plan = dataclasses.replace(plan, window=args.window, herd_window=args.window)
    install_redis_counter()
    install_asyncpg_counter()
    install_asyncmy_counter()
    before = add_revision(args.before) if args.before else None
    chosen = [s for s in SUBJECTS if s.backend in args.backends and not (args.no_peers and s.key in PEERS)]
    results: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "plan": plan.__dict__,
        "machine": machine(),
        "skipped": {},
        "before": before,
    }
    log(f"starting servers for {', '.join(args.backends)}")
    with started(args.backends) as servers:
        results["servers"] = servers.versions
        runnable = []
        for subject in chosen:
            why = servers.skipped.get(subject.backend)
            missing = subject.missing()
            if why is None and missing:
                why = f"not installed: {', '.join(missing)}"
            if why is not None:
                results["skipped"][subject.key] = why
            else:
                runnable.append(subject)
        for backend, why in servers.skipped.items():
            log(f"skipping {backend}: {why}")
        if "uncontended" in args.scenarios:
            results["uncontended"] = asyncio.run(uncontended(runnable, servers, plan, results["skipped"]))
        if "contended" in args.scenarios:
            results["contended"] = contended(runnable, servers, plan, results["skipped"])
        if "herd" in args.scenarios:
            results["herd"] = herd(runnable, servers, plan, results["skipped"])
        if "watchdog" in args.scenarios:
            results["watchdog"] = asyncio.run(watchdog(runnable, servers, plan, results["skipped"]))
        if "connections" in args.scenarios:
            results["connections"] = asyncio.run(connections(runnable, servers, results["skipped"]))
        if "election" in args.scenarios:
            results["election"] = asyncio.run(election(servers, plan, results["skipped"]))
    results["load_avg_end"] = os.getloadavg()
    results["targets"] = report.targets(results)
    results["before_after"] = report.before_after(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = report.markdown(results)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = out / "latest.json"
    json_path.write_text(json.dumps(results, indent=1, default=_jsonable))
    (out / f"bench-{stamp}.json").write_text(json_path.read_text())
    (out / "latest.md").write_text(table)
    chart = report.chart(results, out / "latest.png")
    print(table)
    print(f"\nwrote {json_path}, {out / 'latest.md'}" + (f", {chart}" if chart else " (no chart: matplotlib missing)"))
    if args.check:
        status, summary = report.verdict(results["targets"])
        print(f"\n{summary}")
        return status
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- 1. uncontended ---------------------------------------------------------------


async def uncontended(subjects: list[Subject], servers: Servers, plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """Acquire+release of one free lock, subjects taking turns in rounds."""
    log("uncontended acquire+release")
    opened: dict[str, tuple[Any, Any]] = {}
    for subject in subjects:
        url = servers.urls[subject.backend]
        try:
            if subject.threads:
                tclient = thread_client(subject.key)
                await asyncio.to_thread(tclient.open, url)
                opened[subject.key] = (tclient, tclient.handle("uncontended"))
            else:
                aclient = async_client(subject.key)
                await aclient.open(url)
                opened[subject.key] = (aclient, aclient.handle("uncontended"))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            skipped[subject.key] = f"could not connect: {exc!r}"[:200]
    samples: dict[str, list[float]] = collections.defaultdict(list)
    commands: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    trips: dict[str, int] = collections.defaultdict(int)
    pg_work: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    pg_admin = await _pg_admin(servers) if any(BY_KEY[key].backend == "postgres" for key in opened) else None
    per_round = max(1, plan.iterations // plan.rounds)
    for _ in range(plan.rounds):
        for key, (_client, handle) in opened.items():
            subject = BY_KEY[key]
            threads = subject.threads
            await _loop(handle, plan.warmup, threads)
            counter = server_counter(servers, subject.backend)
            before = counter[0]() if counter else None
            work = await _pg_snapshot(pg_admin, servers) if subject.backend == "postgres" else None
            trips_before = _round_trips(_client)
            samples[key] += await _loop(handle, per_round, threads)
            trips[key] += _round_trips(_client) - trips_before
            if work is not None:
                pg_work[key].update(_pg_delta(work, await _pg_snapshot(pg_admin, servers)))
            if counter:
                after = counter[1]()
                if isinstance(after, dict):
                    commands[key].update(after)
                else:
                    commands[key]["requests"] += after - before
    if pg_admin is not None:
        await pg_admin.close()
    for key, (client, _) in opened.items():
        try:
            if BY_KEY[key].threads:
                await asyncio.to_thread(client.close)
            else:
                await client.close()
        except Exception as exc:  # noqa: BLE001 - closing is not measured
            log(f"closing {key}: {exc!r}")
    out: dict[str, Any] = {}
    for key, times in samples.items():
        subject = BY_KEY[key]
        count = len(times)
        row: dict[str, Any] = {
            "median_us": statistics.median(times) * 1e6,
            "p99_us": percentile(times, 99) * 1e6,
            "samples": count,
        }
        if subject.backend == "redis":
            row["commands_per_acq"] = sum(commands[key].values()) / count
            row["commands"] = {k: round(v / count, 2) for k, v in commands[key].most_common(8)}
            row["round_trips_per_acq"] = trips[key] / count
        elif subject.backend == "zookeeper":
            row["requests_per_acq"] = commands[key]["requests"] / count
        elif subject.backend in ("postgres", "mysql", "etcd"):
            row["round_trips_per_acq"] = trips[key] / count
        if subject.backend == "postgres":
            work = pg_work[key]
            row["xids_per_acq"] = work["xids"] / count
            row["wal_bytes_per_acq"] = work["wal_bytes"] / count
            row["server_cpu_us_per_acq"] = work["server_cpu"] * 1e6 / count
            row["client_cpu_us_per_acq"] = work["client_cpu"] * 1e6 / count
        out[key] = row
    for key, row in out.items():
        subject = BY_KEY[key]
        floor = next((s.key for s in SUBJECTS if s.floor and s.backend == subject.backend and s.key in out), None)
        row["ratio_to_floor"] = row["median_us"] / out[floor]["median_us"] if floor else None
    return out


def _round_trips(client: Any) -> int:
    """Requests sent so far: counted by the subject (etcd), else by the shared counter (Redis, asyncpg)."""
    own = client.round_trips() if hasattr(client, "round_trips") else None
    return Counter.value if own is None else int(own)


async def _pg_admin(servers: Servers) -> Any:
    """A plain asyncpg connection that reads the PostgreSQL server's counters (its requests are not counted)."""
    import asyncpg

    return await asyncpg.connect(servers.urls["postgres"])


async def _pg_snapshot(admin: Any, servers: Servers) -> tuple[int, Any, float, float]:
    """(next transaction id, WAL insert position, server CPU s, this process's CPU s), read before any
    client request is counted: the admin connection's own requests stay out of the round trips."""
    value = Counter.value
    row = await admin.fetchrow(PG_WORK_SQL)
    Counter.value = value
    return int(row["xid"]), row["lsn"], process_tree_cpu(servers.handles["postgres"].pid), time.process_time()


def _pg_delta(before: tuple[int, Any, float, float], after: tuple[int, Any, float, float]) -> dict[str, float]:
    """Work between two snapshots: transaction ids assigned, WAL bytes written, server and client CPU seconds."""
    return {
        "xids": after[0] - before[0],
        "wal_bytes": float(int(after[1]) - int(before[1])),
        "server_cpu": after[2] - before[2],
        "client_cpu": after[3] - before[3],
    }


async def _loop(handle: Any, count: int, threads: bool) -> list[float]:
    if threads:
        return await asyncio.to_thread(_sync_loop, handle, count)
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        await handle.acquire()
        await handle.release()
        times.append(time.perf_counter() - t0)
    return times


def _sync_loop(handle: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        handle.acquire()
        handle.release()
        times.append(time.perf_counter() - t0)
    return times


# -- 2, 3, 4. contended handoff, fairness, server cost -------------------------------


def _contended_run(
    subject: Subject, servers: Servers, name: str, workers: int, procs: int, window: float, hold: float
) -> dict[str, Any]:
    counter = server_counter(servers, subject.backend)
    run = run_contended(
        subject.key,
        servers.urls[subject.backend],
        name,
        workers=workers,
        procs=procs,
        window=window,
        hold=hold,
        before_start=counter[0] if counter else None,
        after_end=counter[1] if counter else None,
    )
    metrics = contention_metrics(run)
    acquisitions = max(1, metrics["acquisitions"])
    metrics.update(procs=run["procs"], workers=workers, stuck=run["stuck"], errors=run["errors"])
    metrics["client_cpu_ms_per_acq"] = run["cpu"] * 1000 / acquisitions
    if subject.backend == "redis":
        stats: dict[str, int] = run["after"]
        metrics["commands_per_acq"] = sum(stats.values()) / acquisitions
        top = collections.Counter(stats).most_common(8)
        metrics["commands"] = {k: round(v / acquisitions, 2) for k, v in top}
        metrics["round_trips_per_acq"] = run["round_trips"] / acquisitions
    elif subject.backend == "zookeeper":
        metrics["requests_per_acq"] = (run["after"] - run["before"]) / acquisitions
    return metrics


def contended(subjects: list[Subject], servers: Servers, plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """Each subject ``plan.repeats`` times, in passes over all subjects (so a burst of load on
    the machine hits one pass, not one subject); the pass with the best throughput is kept."""
    out: dict[str, Any] = {}
    for attempt in range(plan.repeats):
        for subject in subjects:
            if not subject.contended or f"contended:{subject.key}" in skipped:
                continue
            # memory:// is one process's lock table: all its workers live in one process
            procs = 1 if subject.backend == "memory" else plan.procs
            log(f"contended ({attempt + 1}/{plan.repeats}): {subject.key}, {plan.workers} workers, {procs} processes")
            try:
                row = _contended_run(
                    subject, servers, f"contended-{subject.key}-{attempt}", plan.workers, procs, plan.window, plan.hold
                )
            except Exception as exc:  # noqa: BLE001 - reported in the table
                skipped[f"contended:{subject.key}"] = f"failed: {str(exc).strip().splitlines()[-1][:200]}"
                log(f"contended {subject.key} failed: {exc}")
                out.pop(subject.key, None)
                continue
            best = out.get(subject.key)
            runs = [*(best["runs_per_s"] if best else []), row["per_s"]]
            if best is None or row["per_s"] > best["per_s"]:
                best = row
            best["runs_per_s"] = runs
            out[subject.key] = best
    return out


def herd(subjects: list[Subject], servers: Servers, plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """Server cost per handoff with few and with many waiters, spread over processes."""
    out: dict[str, Any] = {}
    small, large = plan.herd
    for subject in subjects:
        if not subject.contended or subject.backend not in ("redis", "zookeeper"):
            continue
        rows: dict[str, dict[str, Any]] = {}
        try:
            for workers in (small, large):
                log(f"herd: {subject.key}, {workers} workers over {plan.procs} processes")
                rows[str(workers)] = _contended_run(
                    subject, servers, f"herd-{subject.key}-{workers}", workers, plan.procs, plan.herd_window, plan.hold
                )
        except Exception as exc:  # noqa: BLE001 - reported in the table
            skipped[f"herd:{subject.key}"] = f"failed: {str(exc).strip().splitlines()[-1][:200]}"
            log(f"herd {subject.key} failed: {exc}")
            continue
        field = "commands_per_acq" if subject.backend == "redis" else "requests_per_acq"
        row: dict[str, Any] = {"field": field, "small": small, "large": large}
        for size, metrics in rows.items():
            row[size] = {
                "cost_per_handoff": metrics[field],
                "per_s": metrics["per_s"],
                "handoff_median_ms": metrics["handoff_median_ms"],
                "share_min": metrics["share_min"],
                "commands": metrics.get("commands"),
            }
        row["growth"] = row[str(large)]["cost_per_handoff"] / row[str(small)]["cost_per_handoff"]
        out[subject.key] = row
    return out


# -- 6. watchdog scale ----------------------------------------------------------------


#: Different locks one client tries to hold at once, and tasks waiting for one held lock.
MANY_LOCKS = 1000
WAITERS = 20


async def connections(subjects: list[Subject], servers: Servers, skipped: dict[str, str]) -> dict[str, Any]:
    """PostgreSQL and MySQL: the server connections one client uses to hold many locks, and to wait for one.

    Holds are asked with ``timeout=0`` (a hold that would need a connection
    the client does not have is refused, not waited for). Connections are
    the client's (its pool's size, or its open sessions) once the holds are
    taken, or while the waiters wait (each waiter is queued when the count is
    read). PostgreSQL's figures are at the top level (``hold_many``,
    ``wait_one``), MySQL's under ``mysql``.
    """
    out: dict[str, Any] = {}
    for backend in ("postgres", "mysql"):
        if not any(subject.key == f"asynclock-{backend}" for subject in subjects):
            continue
        log(f"connections: one {backend} client holding {MANY_LOCKS} locks; {WAITERS} waiters on one")
        try:
            figures = await _connections(servers.urls[backend], backend)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            skipped[f"connections:asynclock-{backend}"] = f"failed: {exc!r}"[:200]
            log(f"connections failed: {exc!r}")
            continue
        if backend == "postgres":
            out.update(figures)
        else:
            out[backend] = figures
    return out


def _connected(locks: Any, backend: str) -> int:
    """The server connections a client has now: its pool's size (PostgreSQL), its sessions (MySQL)."""
    if backend == "postgres":
        return int(locks.backend.pool.get_size())
    return int(locks.backend.connections)


async def _connections(url: str, backend: str) -> dict[str, Any]:
    import asynclock

    out: dict[str, Any] = {}
    async with asynclock.connect(url, ttl=10, prefix="conns") as locks:
        leases = []
        for i in range(MANY_LOCKS):
            with contextlib.suppress(asynclock.LockTimeout):
                leases.append(await locks.lock(f"many-{i}").acquire(timeout=0, detached=True))
        out["hold_many"] = {"asked": MANY_LOCKS, "held": len(leases), "connections": _connected(locks, backend)}
        for lease in leases:
            await lease.release()
    async with (
        asynclock.connect(url, ttl=10, prefix="waits") as holder,
        asynclock.connect(url, ttl=10, prefix="waits") as locks,
    ):
        held = await holder.lock("one").acquire(detached=True)
        one = locks.lock("one")

        async def wait_then_release() -> None:
            lease = await one.acquire(timeout=30, detached=True)
            await lease.release()  # at once: the waiters are granted in the server's order

        waiters = [asyncio.create_task(wait_then_release()) for _ in range(WAITERS)]
        deadline = time.monotonic() + 30
        while (await locks.lock("one").info()).waiters < WAITERS and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        out["wait_one"] = {
            "waiters": WAITERS,
            "queued": (await locks.lock("one").info()).waiters,
            "connections": _connected(locks, backend),
        }
        await held.release()
        await asyncio.gather(*waiters)
    return out


#: Candidates taking turns in the hand-over scenario, each with a client (a session) of its own.
CANDIDATES = 3
#: ``aclose(drain=...)`` of a leader's client: its body ends as soon as it is told to stop, so a
#: hand-over that waited for the drain to run out would show as a gap of this many seconds.
DRAIN = 5.0


async def election(servers: Servers, plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """Leader hand-over: how long after a leader's resign, or after its client's drained close
    began, the next candidate's term starts, per ttl."""
    import asynclock

    out: dict[str, Any] = {}
    for backend, url in servers.urls.items():
        probe = asynclock.connect(url)
        try:
            probe.election("probe")
        except NotImplementedError:
            out[f"asynclock-{backend}"] = {"elections": False}
            continue
        finally:
            await probe.aclose()
        for ttl in plan.election_ttls:
            key = f"asynclock-{backend}:{ttl:g}"
            log(f"election: {key}, {plan.terms} hand-overs between {CANDIDATES} candidates")
            try:
                out[key] = await _handovers(asynclock, url, ttl, plan)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                skipped[f"election:{key}"] = f"failed: {exc!r}"[:200]
                log(f"election {key} failed: {exc!r}")
                continue
            log(f"election: {key}, {plan.closes} hand-overs by aclose(drain={DRAIN:g})")
            try:
                out[key].update(await _closing_handovers(asynclock, url, ttl, plan))
            except Exception as exc:  # noqa: BLE001 - reported in the table
                skipped[f"election-close:{key}"] = f"failed: {exc!r}"[:200]
                log(f"election by close {key} failed: {exc!r}")
    return out


async def _handovers(asynclock: Any, url: str, ttl: float, plan: Plan) -> dict[str, Any]:
    """Candidates lead in turn, each for ``plan.hold`` seconds, then resign: the resign-to-start gaps."""
    starts: list[float] = []
    resigns: list[float] = []
    enough = asyncio.Event()
    clients = [asynclock.connect(url, ttl=ttl, prefix=f"handover{int(ttl * 1000)}") for _ in range(CANDIDATES)]
    async with contextlib.AsyncExitStack() as stack:
        for locks in clients:
            await stack.enter_async_context(locks)

        async def candidate(index: int) -> None:
            election = clients[index].election("bench", identity=f"candidate-{index}")
            while not enough.is_set():
                async with election.leadership():
                    starts.append(time.monotonic())
                    await asyncio.sleep(plan.hold)
                    if len(starts) > plan.terms:
                        enough.set()
                    resigns.append(time.monotonic())
                    await election.resign()

        tasks = [asyncio.create_task(candidate(index)) for index in range(CANDIDATES)]
        try:
            async with asyncio.timeout(60 + plan.terms):
                await enough.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    gaps = [(start - resigned) * 1000 for resigned, start in zip(resigns, starts[1:], strict=False)]
    p99 = percentile(gaps, 99)
    return {
        "ttl": ttl,
        "handovers": len(gaps),
        "median_ms": statistics.median(gaps),
        "p99_ms": p99,
        "p99_share_of_ttl": p99 / 1000 / ttl,
    }


async def _closing_handovers(asynclock: Any, url: str, ttl: float, plan: Plan) -> dict[str, Any]:
    """Candidates lead in turn, each on a client of its own, which it closes with a drain while its
    body runs; from the ``aclose`` call to the next term's start. A candidate whose client was
    closed comes back with a new one, at the end of the line."""
    starts: list[float] = []
    closes: list[float] = []
    enough = asyncio.Event()
    prefix = f"closing{int(ttl * 1000)}"

    async def candidate(index: int) -> None:
        while not enough.is_set():
            locks = asynclock.connect(url, ttl=ttl, prefix=prefix)
            try:
                await locks.open()
                await _lead_then_close(
                    locks, locks.election("bench", identity=f"candidate-{index}"), starts, closes, plan
                )
            finally:
                await locks.aclose()
            if len(closes) >= plan.closes:
                enough.set()

    tasks = [asyncio.create_task(candidate(index)) for index in range(CANDIDATES)]
    try:
        async with asyncio.timeout(60 + plan.closes):
            await enough.wait()
            while len(starts) <= len(closes):  # the last close's next term
                failed = [task for task in tasks if task.done()]
                if failed:
                    await failed[0]
                await asyncio.sleep(0.001)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    gaps = [(start - closed) * 1000 for closed, start in zip(closes, starts[1:], strict=False)]
    return {
        "closes": len(gaps),
        "close_median_ms": statistics.median(gaps),
        "close_p99_ms": percentile(gaps, 99),
        "drain": DRAIN,
    }


async def _lead_then_close(locks: Any, election: Any, starts: list[float], closes: list[float], plan: Plan) -> None:
    """Wait to lead, lead ``plan.hold`` seconds and until another candidate waits behind, then stop
    as a service does: its body is told to stop, and its client closed with a drain at once, which
    waits for the body to end and hands leadership over."""
    leading, stop = asyncio.Event(), asyncio.Event()

    async def lead() -> None:
        async with election.leadership():
            starts.append(time.monotonic())
            leading.set()
            await stop.wait()  # the service's work, until it is told to stop

    body = asyncio.create_task(lead())
    try:
        led = asyncio.create_task(leading.wait())
        await asyncio.wait({body, led}, return_when=asyncio.FIRST_COMPLETED)
        led.cancel()
        if body.done():
            await body  # (raises what ended it)
            return
        await asyncio.sleep(plan.hold)
        await _in_line(election)  # (a hand-over, not a wait for the next candidate to come)
        closes.append(time.monotonic())
        stop.set()
        await locks.aclose(drain=DRAIN)
        await body
    finally:
        body.cancel()
        await asyncio.gather(body, return_exceptions=True)


async def _in_line(election: Any) -> None:
    """Return once a candidate waits behind this one (the server's count; checked every millisecond)."""
    async with asyncio.timeout(30):
        while (await election.info()).waiters < 1:
            await asyncio.sleep(0.001)


async def watchdog(subjects: list[Subject], servers: Servers, plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """Many leases held by one client: what keeping them alive costs per renewal period."""
    import asynclock

    out: dict[str, Any] = {}
    for subject in subjects:
        if not subject.key.startswith("asynclock-") or subject.key.endswith("-fair"):
            # (not an earlier revision; the fair lock's watchdog is the plain lock's batching)
            continue
        # (PostgreSQL: all the locks held at once share the server's lock table,
        # max_locks_per_transaction x max_connections entries: 6,400 by default)
        one_size = subject.backend in ("zookeeper", "etcd", "postgres", "mysql")
        sizes = plan.watchdog[:1] if one_size else plan.watchdog
        for size in sizes:
            log(f"watchdog: {subject.key}, {size} leases, ttl {plan.watchdog_ttl}s")
            key = f"{subject.key}:{size}"
            try:
                out[key] = await _watchdog_one(asynclock, subject, servers, size, plan)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                skipped[f"watchdog:{key}"] = f"failed: {exc!r}"[:200]
                log(f"watchdog {key} failed: {exc!r}")
    return out


async def _watchdog_one(asynclock: Any, subject: Subject, servers: Servers, size: int, plan: Plan) -> dict[str, Any]:
    ttl = plan.watchdog_ttl
    period = ttl / 3
    counter = server_counter(servers, subject.backend)
    async with asynclock.connect(servers.urls[subject.backend], ttl=ttl, prefix=f"wd{size}") as locks:
        go_release = asyncio.Event()
        holders = 100

        async def holder(index: int) -> None:
            names = [f"lease-{i}" for i in range(index, size, holders)]
            for name in names:
                await locks.lock(name).acquire()
            await go_release.wait()
            for name in names:
                await locks.lock(name).release()

        started_at = time.monotonic()
        tasks = [asyncio.create_task(holder(i)) for i in range(holders)]
        try:
            deadline = time.monotonic() + 300
            while (locks._core.keeper is None or len(locks._core.keeper) < size) and time.monotonic() < deadline:
                failed = [t for t in tasks if t.done()]
                if failed:
                    await failed[0]
                await asyncio.sleep(0.05)
            acquire_s = time.monotonic() - started_at
            keeper = locks._core.keeper
            assert keeper is not None
            # let the renewals of the acquisition phase settle into their rhythm
            await asyncio.sleep(1.5 * period)
            renewals = keeper.round_trips
            etcd_client = getattr(locks.backend, "client", None) if subject.backend == "etcd" else None
            wire = Counter.value if etcd_client is None else etcd_client.requests
            server_before = counter[0]() if counter else None
            cpu, wall = time.process_time(), time.monotonic()
            await asyncio.sleep(plan.watchdog_periods * period)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            periods = wall / period
            row: dict[str, Any] = {
                "leases": size,
                "ttl": ttl,
                "acquire_s": acquire_s,
                "renew_calls_per_period": (keeper.round_trips - renewals) / periods,
                "cpu_ms_per_period": cpu * 1000 / periods,
                "cpu_share": cpu / wall,
                "held_after": len(keeper),
            }
            if subject.backend in ("redis", "postgres", "mysql"):
                row["round_trips_per_period"] = (Counter.value - wire) / periods
            if subject.backend == "redis":
                stats = counter[1]() if counter else {}
                row["server_commands_per_period"] = sum(stats.values()) / periods
            elif subject.backend == "zookeeper" and counter:
                row["server_requests_per_period"] = (counter[1]() - server_before) / periods
            elif etcd_client is not None:
                row["round_trips_per_period"] = (etcd_client.requests - wire) / periods
        finally:
            go_release.set()
            await asyncio.wait(tasks, timeout=300)
    return row
