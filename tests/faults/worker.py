"""One worker process: contends for one lock and records every critical section.

With ``workload="election"`` it is a candidate of one election instead: a
critical section is a term (``async with election.leadership()``), ended by a
resign half the time and by leaving the block otherwise; the checker's rules
are the same (no two terms overlap, tokens increase from term to term).

Started by the runner as ``python -m tests.faults.worker '<json config>'``.
It connects its own client, prints ``ready`` once connected, waits for
``go`` on stdin, then loops until it has run ``ops`` sections, ``duration``
seconds have passed, or ``stop`` arrives on stdin. Inside each section it
reads the fenced counter, holds for a while, and writes counter + 1, both
with the lease's token, then appends its token to a log through asynclock's
``RedisFence`` (and, if its lease was lost, once more after the loss, with the
bare token). Every line it writes to its JSONL file is flushed at
once, so a SIGKILL loses nothing already written:

* ``{"ev": "start", "sid", "t", "token"}`` as soon as the body is entered
  (the runner uses it to find the current holder);
* ``{"ev": "section", "sid", "start", "end", "token", "read", "write", "fenced", "late", "outcome"}``
  once the section is over; ``end`` is taken in a ``finally``, so a
  cancelled body still has one; ``outcome`` is ``ok``, ``lost`` (LockLost),
  ``cancelled`` or ``error: …``; ``fenced`` is the outcome of the section's
  write through asynclock's fence with its lease (``ok``, ``refused`` by the
  store, ``lost``: refused before any I/O, ``sent``: unknown), ``late`` that
  of the write a section ended by LockLost still makes, with its bare token;
* ``{"ev": "unavailable", "t", "asked", "outcome"}`` when acquire gave up on an
  unreachable server (allowed: ``BackendUnavailable``);
* ``{"ev": "cancelled", "t", "at"}`` for an operation cancelled on purpose
  before its body ran (acquire) or after (release);
* ``{"ev": "violation", "what"}`` for what only the worker can see (its own
  hold left on the server after a cancellation, an operation stuck past its
  bound on a backend that queues its waiters);
* ``{"ev": "stuck", "asked", "t", "what", "tasks"}`` for an acquire past its
  bound on a backend that does not queue waiters (the plain lock is not fair:
  the checker tells starvation from a lock that stood still);
* ``{"ev": "at_risk", "t", "reason"}`` when a lease goes at risk (a renewal
  failed or did not answer in time), once per streak;
* ``{"ev": "lost", "t", "loss", "warned", "reason"}`` when a lease is lost;
  ``warned``: whether it went at risk since it was acquired or last renewed;
* ``{"ev": "done", "ops", "t"}``.

On ``memory://`` the runner can also send ``stall <seconds>``: the worker
stalls its own client's renewals for that long (asynclock.testing's fault
controls; a memory:// lock table is this process's own).

Times are ``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so
they compare across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import asynclock
from tests.faults.store import FencedStore


@dataclass
class WorkerConfig:
    url: str
    store_url: str
    store_prefix: str
    out: str
    name: str = "fault"
    prefix: str = "faults"
    ttl: float = 1.0
    hold: tuple[float, float] = (0.005, 0.03)
    pause: tuple[float, float] = (0.0, 0.01)
    #: now and then a long section (for faults that must land inside one)
    long_hold: tuple[float, float] | None = None
    long_rate: float = 0.0
    ops: int = 1_000_000
    duration: float = 10.0
    #: probability that an operation is cancelled at a random point
    cancel_rate: float = 0.0
    #: an acquire that waits longer than this is recorded as a violation (None: no bound)
    acquire_bound: float | None = None
    #: whether the backend gives fencing tokens (Redlock does not)
    tokens: bool = True
    #: "lock" (a plain lock) or "election" (each section a term of leadership)
    workload: str = "lock"
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        data = dict(self.__dict__)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        data = json.loads(text)
        for key in ("hold", "pause", "long_hold"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


class Journal:
    """The worker's JSONL file: one flushed line per event."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, **event: Any) -> None:
        if self._file.closed:
            return  # (an event delivered while the client closed, after the run)
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.journal = Journal(config.out)
        self.who = f"{os.getpid()}"
        self.sid = 0
        self.stop = asyncio.Event()
        #: tries, answers and wake-ups of this client (Redis only; for the report of a stuck acquire)
        self.counts: dict[str, int] = {}
        self.locks: asynclock.Locks | None = None
        #: whether the lease held now went at risk since it was acquired or last renewed
        self.at_risk = False

    async def run(self) -> None:
        config = self.config
        store = FencedStore(config.store_url, config.store_prefix)
        locks = self.locks = asynclock.connect(
            config.url, ttl=config.ttl, prefix=config.prefix, on_event=self._on_event
        )
        try:
            async with locks:
                lock: asynclock.Lock | asynclock.Election = locks.lock(config.name)
                if config.workload == "election":
                    lock = locks.election(config.name, identity=f"w{os.getpid()}")
                await lock.info()  # connected
                self.counts = _count_wakeups(locks)
                self.journal.write(ev="ready", pid=os.getpid(), client=locks.client_id, t=time.monotonic())
                await self._wait_for_go()
                ops = 0
                until = time.monotonic() + config.duration
                while ops < config.ops and time.monotonic() < until and not self.stop.is_set():
                    await self._one(locks, lock, store)
                    ops += 1
                    await asyncio.sleep(self.rng.uniform(*config.pause))
                self.journal.write(ev="done", ops=ops, t=time.monotonic())
        finally:
            await store.aclose()
            self.journal.close()

    def _on_event(self, event: asynclock.LockEvent) -> None:
        """Journal when a lease goes at risk, and each loss with whether it went at risk first."""
        if event.kind in ("acquired", "renewed"):
            self.at_risk = False
        elif event.kind == "at_risk":
            if not self.at_risk:
                self.journal.write(ev="at_risk", t=time.monotonic(), reason=event.reason)
            self.at_risk = True
        elif event.kind == "lost":
            loss = None if event.loss is None else str(event.loss)
            self.journal.write(ev="lost", t=time.monotonic(), loss=loss, warned=self.at_risk, reason=event.reason)
            self.at_risk = False

    def _stall(self, seconds: float) -> None:
        from asynclock.testing import faults

        assert self.locks is not None
        faults(self.locks).stall_renewals(seconds)

    async def _wait_for_go(self) -> None:
        loop = asyncio.get_running_loop()
        go = asyncio.Event()

        def post(callback: Callable[..., object], *args: object) -> bool:
            # The loop may be gone already: the worker finished its operations
            # and returned while the runner was still writing to it.
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:
                return False
            return True

        def read_stdin() -> None:
            for line in sys.stdin:
                word = line.strip()
                if word == "go":
                    sent = post(go.set)
                elif word == "stop":
                    sent = post(self.stop.set)
                elif word.startswith("stall "):
                    sent = post(self._stall, float(word.split()[1]))
                else:
                    continue
                if not sent:
                    return
            if post(go.set):
                post(self.stop.set)

        threading.Thread(target=read_stdin, daemon=True).start()
        await go.wait()

    async def _one(self, locks: asynclock.Locks, lock: asynclock.Lock | asynclock.Election, store: FencedStore) -> None:
        config = self.config
        phase = ["acquire"]
        asked = time.monotonic()
        before = dict(self.counts)
        task = asyncio.create_task(self._section(lock, store, phase))
        if config.cancel_rate and self.rng.random() < config.cancel_rate:
            await asyncio.wait([task], timeout=self.rng.uniform(0, 2 * config.hold[1] + 0.01))
            if not task.done():
                task.cancel()
                at = phase[0]
                try:
                    await task
                except asyncio.CancelledError:
                    self.journal.write(ev="cancelled", t=time.monotonic(), at=at)
                await self._check_no_leftover_hold(locks, lock)
                return
        bound = config.acquire_bound
        await asyncio.wait([task], timeout=None if bound is None else bound + 2 * config.ttl)
        if task.done():
            task.result()
            return
        # stuck: say where every task of this process is, then give up on it
        stacks, stuck_in, given_up = _stacks(), phase[0], time.monotonic()  # (before the body can move on)
        meanwhile = {key: value - before.get(key, 0) for key, value in self.counts.items()}
        try:
            seen = repr(await asyncio.wait_for(lock.info(), config.ttl))
            seen += await _listening(locks, config.name)
        except Exception as exc:  # noqa: BLE001 - only for the report
            seen = f"info failed: {exc!r}"
        what = f"an operation did not finish within {bound}s + 2 ttl; the server shows {seen}; phase {stuck_in}"
        what += f"; meanwhile this client counted {meanwhile}"
        if stuck_in != "release" and config.workload == "lock" and not _plain_lock_queues(locks):
            # The plain lock is not fair here (Redis Cluster, Redlock, memory):
            # a waiter may lose every race for it.
            # The checker decides (from the others' sections meanwhile) whether
            # the lock kept changing hands or stood still.
            self.journal.write(ev="stuck", asked=asked, t=given_up, what=what, tasks=stacks)
        else:
            self.journal.write(ev="violation", what=f"{what}; tasks:\n{stacks}")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _section(self, lock: asynclock.Lock | asynclock.Election, store: FencedStore, phase: list[str]) -> None:
        config = self.config
        section: dict[str, Any] | None = None
        outcome = "ok"
        asked = time.monotonic()
        held = lock if isinstance(lock, asynclock.Lock) else lock.leadership()
        resign = isinstance(lock, asynclock.Election) and self.rng.random() < 0.5
        try:
            async with held as lease:
                phase[0] = "body"
                self.sid += 1
                if config.tokens:
                    assert lease.token is not None, "this backend gives tokens"
                    token = lease.token
                else:
                    # No fencing tokens (Redlock): every operation carries 0, which
                    # the store never refuses; only exclusion protects the counter.
                    assert lease.token is None, "a token where none was expected"
                    token = 0
                section = {"ev": "section", "sid": self.sid, "start": time.monotonic(), "token": token}
                section.update(read=None, write=None, fenced=None, late=None, wait=section["start"] - asked)
                hold = self.rng.uniform(*config.hold)
                if config.long_hold is not None and self.rng.random() < config.long_rate:
                    hold = self.rng.uniform(*config.long_hold)
                self.journal.write(ev="start", sid=self.sid, t=section["start"], token=token, hold=hold)
                try:
                    section["read"] = "sent"
                    value = await store.read(token, self.who)
                    section["read"] = "refused" if value is None else "ok"
                    await asyncio.sleep(hold)
                    if value is not None:
                        section["write"] = "sent"
                        accepted = await store.write(token, value + 1, self.who)
                        section["write"] = "ok" if accepted else "refused"
                    if config.tokens:
                        # through asynclock's fence, with the lease, as an application writes
                        section["fenced"] = "sent"
                        section["fenced"] = await store.fenced(lease, f"{self.who} {section['sid']}", config.name)
                    if resign:
                        assert isinstance(lock, asynclock.Election)
                        await lock.resign()  # the term ends here: the block is left without an exception
                finally:
                    section["end"] = time.monotonic()
                    # the trusted deadline it had (loop time is this clock): a body cancelled by it
                    # but run late by a busy machine is told apart from one cancelled late (checker)
                    trusted = lease.lease if isinstance(lease, asynclock.Term) else lease
                    section["deadline"] = trusted.expires_at
                    # journaled before the release goes out: a worker killed from
                    # now on (its release under way) is no longer in its section
                    self.journal.write(ev="end", sid=self.sid, t=section["end"])
                    phase[0] = "release"
        except asynclock.LockLost:
            outcome = "lost"
            if section is not None and config.tokens:
                # The holder learns of the loss and still writes, with the bare token (as a
                # downstream worker handed only the token would): the store's mark, not the
                # lease, must refuse it if a newer holder wrote meanwhile.
                section["late"] = "sent"
                section["late"] = await store.fenced(section["token"], f"{self.who} {section['sid']}", config.name)
        except asynclock.BackendUnavailable as exc:
            # acquire (or release) may give up on a server that stays away: allowed
            outcome = f"unavailable: {exc!r}"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - recorded for the checker
            outcome = f"error: {exc!r}"
        finally:
            if section is not None:
                section["outcome"] = outcome
                self.journal.write(**section)
            elif outcome.startswith("error"):
                self.journal.write(ev="failed", t=time.monotonic(), outcome=outcome)
            elif outcome.startswith("unavailable"):
                self.journal.write(ev="unavailable", t=time.monotonic(), asked=asked, outcome=outcome)

    async def _check_no_leftover_hold(self, locks: asynclock.Locks, lock: asynclock.Lock | asynclock.Election) -> None:
        """After a cancelled operation, this client must not keep (or get) the lock."""
        deadline = time.monotonic() + self.config.ttl / 2
        mine = locks.client_id if isinstance(lock, asynclock.Lock) else lock.identity
        assert mine is not None
        while True:
            try:
                owner = (await lock.info()).owner
            except asynclock.LockError:
                return  # the server is away (a fault); nothing to see
            if owner is None or (owner != mine if isinstance(lock, asynclock.Election) else not owner.startswith(mine)):
                return
            if time.monotonic() >= deadline:
                self.journal.write(ev="violation", what=f"hold {owner} left on the server after a cancellation")
                return
            await asyncio.sleep(0.01)


def _stacks() -> str:
    """Where every task of this process is (for the report of a stuck operation)."""
    lines = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        lines.append(f"task {task.get_name()}:")
        awaited: Any = task.get_coro()
        while awaited is not None:  # down the chain of awaited coroutines
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is None:
                lines.append(f"    awaiting {awaited!r}"[:300])
                break
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_qualname}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return "\n".join(lines)


def _count_wakeups(locks: asynclock.Locks) -> dict[str, int]:
    """On Redis, count this client's tries, the ones the server queued, hand-over messages and
    resyncs (by wrapping the backend's methods: diagnostics only, nothing else changes)."""
    from asynclock.abc import Queued
    from asynclock.backends.redis import RedisBackend

    counts = {"tries": 0, "queued": 0, "hand-over messages": 0, "resyncs": 0}
    backend = locks.backend
    if not isinstance(backend, RedisBackend):
        return {}
    try_acquire = backend.try_acquire
    handovers = backend._handovers
    handle, resync = handovers.handle, handovers.resync

    async def counted_try(*args: Any, **kwargs: Any) -> Any:
        counts["tries"] += 1
        answer = await try_acquire(*args, **kwargs)
        counts["queued"] += isinstance(answer, Queued)
        return answer

    def counted_handle(payload: bytes) -> None:
        counts["hand-over messages"] += 1
        handle(payload)

    def counted_resync() -> None:
        counts["resyncs"] += 1
        resync()

    backend.try_acquire = counted_try  # type: ignore[method-assign]
    handovers.handle = counted_handle  # type: ignore[method-assign]
    handovers.resync = counted_resync  # type: ignore[method-assign]
    return counts


async def _listening(locks: asynclock.Locks, name: str) -> str:
    """For a report on Redis: who listens for this client's hand-overs, and how its listener fared."""
    from asynclock.backends.redis import RedisBackend

    backend = locks.backend
    if not isinstance(backend, RedisBackend):
        return ""
    channel = backend._handovers.channel
    numsub = await backend.client.pubsub_numsub(channel)
    listener = backend._pubsub
    seen = ""
    writer = getattr(listener._conn, "_writer", None)
    if writer is not None:  # this listener's connection as the server sees it
        host, port = writer.get_extra_info("sockname")[:2]
        for client in await backend.client.client_list():
            if client.get("addr") == f"{host}:{port}":
                seen = f" (server side: sub={client.get('sub')} cmd={client.get('cmd')} age={client.get('age')})"
    return f"; subscribers of {channel}: {numsub}; this client's listener reconnected {listener.reconnects} times{seen}"


def _plain_lock_queues(locks: asynclock.Locks) -> bool:
    """Whether the server queues the plain lock's waiters (then it is fair, and a stuck waiter is a violation)."""
    # (imported here: the test harnesses are far more than a worker process needs to start)
    from tests.harnesses import insides

    return not insides.notifies(locks)  # a backend that answers Busy races its waiters


def main(argv: list[str]) -> None:
    config = WorkerConfig.from_json(argv[0])
    asyncio.run(Worker(config).run())


if __name__ == "__main__":
    main(sys.argv[1:])
