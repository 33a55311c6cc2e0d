"""The measuring loops, the worker processes, and the arithmetic over what they saw.

Contended runs spread their workers over several processes (``spawn``): each
process opens one client of the subject, makes one lock handle per worker,
warms up, says it is ready, and starts when the parent says so. Each worker
loops acquire → hold → release until the window closes and records the
``time.monotonic()`` at which each call returned; on Linux that clock is
system-wide, so a release in one process and the next acquire in another
compare directly.

Client round trips to Redis are counted by wrapping redis-py's
``send_packed_command`` (sync and asyncio): every request written to a
connection, a pipeline counting once, pub/sub (UN)SUBSCRIBE included, incoming
pub/sub messages not. Round trips to PostgreSQL are counted by wrapping
asyncpg's ``Connection._execute`` (every prepared-statement request: one
Bind/Execute/Sync exchange) and ``Connection.execute`` without arguments (one
simple query, however many statements it holds).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .subjects import BY_KEY, async_client, thread_client

#: Uncontended acquire+release cycles each worker process does before it says it is ready.
WARMUP = 20

#: (worker, acquire called, acquire returned, release called, release returned)
Event = tuple[int, float, float, float, float]


class Counter:
    """Requests written to Redis by this process (see the module docstring)."""

    value = 0
    lock = threading.Lock()
    installed = False


def install_redis_counter() -> None:
    if Counter.installed:
        return
    try:
        import redis.asyncio.connection as async_conn
        import redis.connection as sync_conn
    except ImportError:
        return
    async_send = async_conn.AbstractConnection.send_packed_command
    sync_send = sync_conn.AbstractConnection.send_packed_command

    async def counted_async(self: Any, command: Any, check_health: bool = True) -> None:
        Counter.value += 1
        await async_send(self, command, check_health)

    def counted_sync(self: Any, command: Any, check_health: bool = True) -> None:
        with Counter.lock:
            Counter.value += 1
        sync_send(self, command, check_health)  # type: ignore[no-untyped-call]

    async_conn.AbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign]
    sync_conn.AbstractConnection.send_packed_command = counted_sync  # type: ignore[method-assign]
    Counter.installed = True


def install_asyncpg_counter() -> None:
    """Count asyncpg requests into ``Counter`` too (the uncontended scenario's round trips per pair)."""
    try:
        from asyncpg.connection import Connection
    except ImportError:
        return
    if getattr(Connection, "_counted", False):
        return
    execute = Connection._execute
    simple = Connection.execute

    async def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        Counter.value += 1
        return await execute(self, *args, **kwargs)

    async def counted_simple(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if not args:
            Counter.value += 1
        return await simple(self, query, *args, **kwargs)

    Connection._execute = counted_execute  # type: ignore[method-assign]
    Connection.execute = counted_simple  # type: ignore[method-assign]
    Connection._counted = True  # type: ignore[attr-defined]


def install_asyncmy_counter() -> None:
    """Count asyncmy requests (statements and pings) into ``Counter`` too (MySQL's round trips per pair)."""
    try:
        from asyncmy.connection import Connection
    except ImportError:
        return
    if getattr(Connection, "_counted", False):
        return
    query = Connection.query
    ping = Connection.ping

    async def counted_query(self: Any, *args: Any, **kwargs: Any) -> Any:
        Counter.value += 1
        return await query(self, *args, **kwargs)

    async def counted_ping(self: Any, *args: Any, **kwargs: Any) -> Any:
        Counter.value += 1
        return await ping(self, *args, **kwargs)

    Connection.query = counted_query  # type: ignore[method-assign]
    Connection.ping = counted_ping  # type: ignore[method-assign]
    Connection._counted = True  # type: ignore[attr-defined]


# -- worker loops ---------------------------------------------------------------


async def async_worker(handle: Any, wid: int, start: float, end: float, hold: float, events: list[Event]) -> None:
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    while time.monotonic() < end:
        t0 = time.monotonic()
        await handle.acquire()
        t1 = time.monotonic()
        await asyncio.sleep(hold)
        t2 = time.monotonic()
        await handle.release()
        t3 = time.monotonic()
        events.append((wid, t0, t1, t2, t3))


def sync_worker(handle: Any, wid: int, start: float, end: float, hold: float, events: list[Event]) -> None:
    time.sleep(max(0.0, start - time.monotonic()))
    while time.monotonic() < end:
        t0 = time.monotonic()
        handle.acquire()
        t1 = time.monotonic()
        time.sleep(hold)
        t2 = time.monotonic()
        handle.release()
        t3 = time.monotonic()
        events.append((wid, t0, t1, t2, t3))


# -- one worker process ---------------------------------------------------------


@dataclass
class ProcSpec:
    subject: str
    url: str
    name: str
    proc: int
    workers: int
    first_wid: int
    window: float
    hold: float


def child_main(spec: ProcSpec, ready: Any, go: Any, start_at: Any, results: Any, done: Any) -> None:
    """Entry point of a worker process (multiprocessing, spawn)."""
    install_redis_counter()
    install_asyncmy_counter()
    try:
        if BY_KEY[spec.subject].threads:
            _child_threads(spec, ready, go, start_at, results, done)
        else:
            asyncio.run(_child_async(spec, ready, go, start_at, results, done))
    except BaseException:  # noqa: BLE001 - report anything to the parent, never hang it
        results.put({"proc": spec.proc, "error": traceback.format_exc(limit=8)})
        ready.put(("failed", spec.proc))


async def _child_async(spec: ProcSpec, ready: Any, go: Any, start_at: Any, results: Any, done: Any) -> None:
    client = async_client(spec.subject)
    await client.open(spec.url)
    try:
        warm = client.handle(f"{spec.name}-warm-{spec.proc}")
        for _ in range(WARMUP):
            await warm.acquire()
            await warm.release()
        handles = [client.handle(spec.name) for _ in range(spec.workers)]
        ready.put(("ready", spec.proc))
        if not await asyncio.to_thread(go.wait, 120):
            raise RuntimeError("no start signal")
        start = start_at.value
        end = start + spec.window
        events: list[Event] = []
        before = Counter.value
        cpu = time.process_time()
        tasks = [
            asyncio.create_task(async_worker(h, spec.first_wid + i, start, end, spec.hold, events))
            for i, h in enumerate(handles)
        ]
        _, pending = await asyncio.wait(tasks, timeout=spec.window + 60)
        for task in pending:
            task.cancel()
        errors = [repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()]
        results.put(
            {
                "proc": spec.proc,
                "events": events,
                "round_trips": Counter.value - before,
                "cpu": time.process_time() - cpu,
                "stuck": len(pending),
                "errors": errors[:3],
            }
        )
        await asyncio.to_thread(done.wait, 120)
    finally:
        await client.close()


def _child_threads(spec: ProcSpec, ready: Any, go: Any, start_at: Any, results: Any, done: Any) -> None:
    client = thread_client(spec.subject)
    client.open(spec.url)
    try:
        warm = client.handle(f"{spec.name}-warm-{spec.proc}")
        for _ in range(WARMUP):
            warm.acquire()
            warm.release()
        handles = [client.handle(spec.name) for _ in range(spec.workers)]
        ready.put(("ready", spec.proc))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        start = start_at.value
        end = start + spec.window
        events: list[Event] = []
        errors: list[str] = []
        before = Counter.value
        cpu = time.process_time()

        def run(handle: Any, wid: int) -> None:
            try:
                sync_worker(handle, wid, start, end, spec.hold, events)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                errors.append(repr(exc))

        threads = [
            threading.Thread(target=run, args=(h, spec.first_wid + i), daemon=True) for i, h in enumerate(handles)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + spec.window + 60
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        results.put(
            {
                "proc": spec.proc,
                "events": list(events),
                "round_trips": Counter.value - before,
                "cpu": time.process_time() - cpu,
                "stuck": sum(thread.is_alive() for thread in threads),
                "errors": errors[:3],
            }
        )
        done.wait(120)
    finally:
        client.close()


def run_contended(
    subject: str,
    url: str,
    name: str,
    *,
    workers: int,
    procs: int,
    window: float,
    hold: float,
    before_start: Callable[[], Any] | None = None,
    after_end: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run ``workers`` workers over ``procs`` processes on one lock for ``window`` seconds.

    ``before_start`` runs once every process is ready (reset server stats),
    ``after_end`` once every process has reported and before any closes
    (read server stats); their results come back as ``"before"``/``"after"``.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, done = ctx.Event(), ctx.Event()
    start_at = ctx.Value("d", 0.0)
    per = [workers // procs + (1 if i < workers % procs else 0) for i in range(procs)]
    specs, first = [], 0
    for proc, count in enumerate(per):
        if count:
            specs.append(ProcSpec(subject, url, name, proc, count, first, window, hold))
            first += count
    children = [ctx.Process(target=child_main, args=(s, ready, go, start_at, results, done)) for s in specs]
    for child in children:
        child.start()
    out: dict[str, Any] = {"procs": len(specs), "workers": workers}
    reports: list[dict[str, Any]] = []
    try:
        failed = False
        for _ in specs:
            status, _proc = ready.get(timeout=120)
            failed = failed or status != "ready"
        if failed:
            while len(reports) < len(specs):
                reports.append(results.get(timeout=30))
                if "error" in reports[-1]:
                    break
            raise RuntimeError(next(r["error"] for r in reports if "error" in r))
        if before_start is not None:
            out["before"] = before_start()
        start_at.value = time.monotonic() + 0.2
        go.set()
        for _ in specs:
            reports.append(results.get(timeout=window + 120))
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            raise RuntimeError(errors[0])
        if after_end is not None:
            out["after"] = after_end()
    finally:
        done.set()
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join(5)
    events: list[Event] = [(e[0], e[1], e[2], e[3], e[4]) for r in reports for e in r["events"]]
    out.update(
        start=start_at.value,
        window=window,
        events=events,
        round_trips=sum(r["round_trips"] for r in reports),
        cpu=sum(r["cpu"] for r in reports),
        stuck=sum(r["stuck"] for r in reports),
        errors=[e for r in reports for e in r["errors"]],
    )
    return out


# -- arithmetic -----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def contention_metrics(run: dict[str, Any]) -> dict[str, Any]:
    """Throughput, handoff latency, longest run and shares from a contended run's events."""
    events: list[Event] = sorted(run["events"], key=lambda e: e[2])
    start, window, workers = run["start"], run["window"], run["workers"]
    in_window = [e for e in events if start <= e[2] < start + window]
    handoffs: list[float] = []
    longest = current = 0
    previous: Event | None = None
    for event in events:
        if previous is not None and event[0] == previous[0]:
            current += 1
        else:
            current = 1
        longest = max(longest, current)
        # A handoff: another worker was already waiting when the holder let go.
        if previous is not None and event[0] != previous[0] and event[1] <= previous[3]:
            handoffs.append(event[2] - previous[4])
        previous = event
    counts = [0] * workers
    for event in in_window:
        counts[event[0]] += 1
    mean = statistics.fmean(counts) if counts else 0.0
    overlaps = sum(1 for a, b in itertools.pairwise(events) if b[2] < a[3])
    return {
        "acquisitions": len(events),
        "per_s": len(in_window) / window,
        "handoff_median_ms": percentile(handoffs, 50) * 1000,
        "handoff_p99_ms": percentile(handoffs, 99) * 1000,
        "handoffs": len(handoffs),
        "longest_run": longest,
        "share_min": min(counts) / mean if mean else 0.0,
        "share_max": max(counts) / mean if mean else 0.0,
        "counts": counts,
        "overlaps": overlaps,  # a later hold began before the earlier one was released: must be 0
    }
