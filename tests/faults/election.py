"""The election workload on memory://, in one process.

memory:// keeps one lock table per process, so its candidates are tasks here,
each with a client of its own, running the workers' own critical sections
(``Worker._section``: a term of leadership, a fenced read and write, a resign
half the time). Faults come from the testing kit, at the current leader: its
term lost at once (what a session loss does), its renewals stalled past its
ttl (what a pause does to a lease), its task cancelled mid-term (a crash of
the candidate: the hold is given back by identity). The checker's rules are
those of the process runs: no two terms overlap, tokens increase from term
to term, the fenced counter loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from pathlib import Path

import asynclock
import asynclock.testing
from tests.faults.checker import WorkerLog, check
from tests.faults.scenarios import Outcome, Settings
from tests.faults.store import FencedStore
from tests.faults.worker import Worker, WorkerConfig
from tests.servers.base import SCALE

__all__ = ["memory_election"]

FAULTS = ("lose", "stall", "crash")


async def memory_election(store_url: str, workdir: Path, settings: Settings) -> Outcome:
    """Candidates in this process contend for one election while faults hit the leader."""
    started = time.monotonic()
    ttl = settings.scaled_ttl()
    tag = secrets.token_hex(3)
    prefix, name = f"fe{tag}", "fault"
    rng = random.Random(f"{settings.seed}-memory-election")
    store = FencedStore(store_url, f"store-{tag}")
    clients = [asynclock.connect("memory://", ttl=ttl, prefix=prefix) for _ in range(settings.workers)]
    workers = []
    for index in range(settings.workers):
        config = WorkerConfig(
            url="memory://",
            store_url=store_url,
            store_prefix=f"store-{tag}",
            out=str(workdir / f"{prefix}-w{index}.jsonl"),
            prefix=prefix,
            ttl=ttl,
            hold=(0.005, 0.04),
            pause=(0.0, 0.01),
            long_hold=(ttl, 2 * ttl),
            long_rate=0.3,
            acquire_bound=20 * ttl,
            seed=rng.randrange(2**32),
            workload="election",
        )
        worker = Worker(config)
        worker.who = f"{os.getpid()}-{index}"
        workers.append(worker)
    elections = [locks.election(name, identity=f"w{index}") for index, locks in enumerate(clients)]
    until = time.monotonic() + settings.duration * SCALE
    faults = 0
    hit: list[float] = []  # when each fault was injected
    notes: list[str] = []

    async def candidate(index: int) -> None:
        worker = workers[index]
        while time.monotonic() < until:
            await worker._section(elections[index], store, ["acquire"])
            await asyncio.sleep(worker.rng.uniform(*worker.config.pause))

    loops = [asyncio.create_task(candidate(index)) for index in range(settings.workers)]
    try:
        for index, worker in enumerate(workers):
            worker.journal.write(ev="ready", pid=os.getpid(), client=clients[index].client_id, t=time.monotonic())
        observer = clients[0].election(name)
        while time.monotonic() < until - ttl and faults < settings.faults:
            await asyncio.sleep(rng.uniform(0.2, 0.6) * ttl)
            leader = await observer.leader()
            if leader is None:
                continue
            index = int(leader.identity.removeprefix("w"))
            fault = FAULTS[faults % len(FAULTS)]
            if fault == "lose":
                asynclock.testing.faults(clients[index]).lose(name)
            elif fault == "stall":
                asynclock.testing.faults(clients[index]).stall_renewals(rng.uniform(1.2, 2.0) * ttl)
            else:
                loops[index].cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loops[index]
                loops[index] = asyncio.create_task(candidate(index))
            faults += 1
            hit.append(time.monotonic())
            notes.append(f"{fault} w{index}")
        await asyncio.gather(*loops)
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for index, worker in enumerate(workers):
            worker.journal.write(ev="done", ops=worker.sid, t=time.monotonic())
            worker.journal.close()
            await clients[index].aclose()
    try:
        state = await store.state()
        await store.clear()
    finally:
        await store.aclose()
    logs = [WorkerLog.read(index, Path(worker.config.out)) for index, worker in enumerate(workers)]
    verdict = check(logs, state)
    if not faults:
        verdict.violations.append("no fault was injected: the run proved nothing")
    # liveness: after each fault, somebody leads again soon (unless the run ended first)
    bound = 10 * ttl
    starts = [section.start for log in logs for section in log.sections]
    for when in hit:
        if when + bound < until and not any(when < start <= when + bound for start in starts):
            verdict.violations.append(f"no term began within {bound:.1f}s of a fault at {when:.3f}")
    return Outcome("faults at the leader (election)", "memory", verdict, faults, notes, time.monotonic() - started)
