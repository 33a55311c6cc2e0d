"""The README's example and the calls the documentation teaches, type-checked
by mypy --strict (not run; tests/test_docs.py runs the blocks themselves): a
change to a public signature that breaks them fails the checks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asynclock

log = logging.getLogger(__name__)


async def build_report(*, fencing_token: int | None) -> None: ...


async def quickstart() -> None:
    async with asynclock.connect("memory://", ttl=10) as locks:
        async with locks.lock("orders:42") as lease:
            token: int | None = lease.token
            print("holding orders:42 with fencing token", token)


async def using_it() -> None:
    async with asynclock.connect("redis://localhost:6379/0", ttl=30) as locks:
        lock = locks.lock("reports:daily")
        try:
            async with lock as lease:
                await build_report(fencing_token=lease.token)
        except asynclock.LockLost as lost:
            log.warning("stopped: %s", lost.reason)


async def manual() -> None:
    async with asynclock.connect("memory://") as locks:
        lock = locks.lock("n", ttl=5.0)
        lease: asynclock.Lease = await lock.acquire(timeout=1.5)
        held: bool = lock.held
        info: asynclock.LockInfo = await lock.info()
        owner: str | None = info.owner
        reason: str = await lease.wait_lost() if lease.lost else ""
        await lock.release()
        print(held, owner, reason, lease.hold_count, lease.expires_at, lease.name)


async def wait_at_most() -> None:
    async with asynclock.connect("memory://") as locks:
        lock = locks.lock("orders:42", max_hold=600)
        cap: float | None = lock.max_hold
        async with lock.acquire(timeout=5) as lease:
            token: int | None = lease.token
            print(cap, token)
        rw = locks.rw_lock("catalog", max_hold=60)
        async with rw.read.acquire(timeout=5), locks.semaphore("s", permits=2).acquire(timeout=5) as permit:
            print(permit.token)
        task: asyncio.Task[asynclock.Lease] = asyncio.create_task(lock.acquire())
        await (await task).release()


def on_event(event: asynclock.LockEvent) -> None:
    wait: float | None = event.wait_s
    print(event.kind, event.name, event.owner, event.token, wait, event.held_s, event.reason)


def with_callback() -> asynclock.Locks:
    return asynclock.connect("memory://", on_event=on_event)


async def detached_across_tasks() -> None:
    async with asynclock.connect("memory://", connect_timeout=2.0) as locks:
        lease: asynclock.Lease = await locks.lock("import:catalog").acquire(timeout=0, detached=True)
        await lease.release()


async def bounded_wait(locks: asynclock.Locks) -> int | None:
    token: int | None = None
    waiting = asyncio.timeout(5)
    async with waiting:
        async with locks.lock("report:daily") as lease:
            waiting.reschedule(None)
            token = lease.token
    return token


def classify(exc: Exception) -> str:
    if isinstance(exc, asynclock.ConfigurationError):
        return "fix the configuration"
    if isinstance(exc, asynclock.BackendUnavailable):
        return "retry later"
    return "unknown"


async def run_scheduler(*, fencing_token: int | None) -> None: ...


async def leadership(locks: asynclock.Locks) -> None:
    election: asynclock.Election = locks.election("scheduler", identity="replica-7", ttl=10)
    async with election.leadership(timeout=None) as term:
        identity: str = term.identity
        since: float = term.since
        lease: asynclock.Lease = term.lease
        await run_scheduler(fencing_token=term.token)
        print(identity, since, lease.remaining)
        await election.resign()
    leader: asynclock.Leader | None = await election.leader()
    if leader is not None:
        print(leader.identity, leader.token, leader.since)
    async for change in election.observe():
        print(None if change is None else change.identity)
        break


async def singleton_job(locks: asynclock.Locks) -> None:
    @locks.singleton("nightly-report", at_most=600, at_least=60)
    async def nightly_report(day: str) -> int:
        return len(day)

    value: int | None = await nightly_report("monday")
    run: asynclock.JobRun[int] = await nightly_report.attempt("tuesday")
    ran: bool = run.ran
    print(value, ran, run.value, run.token)


def guarantees() -> None:
    locks = asynclock.connect("zk://zk1:2181/app", require={"fencing", "survives_failover"})
    words: frozenset[str] = locks.guarantees
    print("session" in words)


async def breaking(locks: asynclock.Locks) -> None:
    broken: asynclock.LockInfo | None = await locks.break_lock("jobs:nightly")
    if broken is not None:
        again = await locks.break_lock("jobs:nightly", owner=broken.owner)
        print(broken.owner, broken.token, again)


async def fences(locks: asynclock.Locks, conn: Any) -> None:
    import redis.asyncio as redis

    from asynclock.fencing import PostgresFence, RedisFence, StaleToken

    store = redis.Redis.from_url("redis://localhost:6379/0")
    fence = RedisFence(store, prefix="fence")
    async with locks.lock("orders:42") as lease:
        reply: Any = await fence.call(lease, "HSET", "{orders:42}:order", "state", "paid")
        print(reply, fence.mark_key("orders:42"))
        async with conn.transaction():
            await PostgresFence(table="asynclock_fences").advance(conn, lease)
    try:
        await fence.call(17, "SET", "{orders:42}:state", "paid", resource="orders:42")
    except StaleToken as stale:
        mark: int | None = stale.mark
        print(stale.resource, stale.token, mark)
    async with locks.election("scheduler", identity="a").leadership() as term:
        await fence.call(term, "SET", "{scheduler}:ran", "1")


async def multi_lock(locks: asynclock.Locks) -> dict[str, int | None]:
    accounts: asynclock.MultiLock = locks.multi(["acct:1", "acct:2"], ttl=10, max_hold=60)
    async with accounts as lease:
        tokens: dict[str, int | None] = lease.tokens
        part: asynclock.Lease = lease.parts["acct:1"]
        print(part.token, lease.names, accounts.held)
    async with accounts.acquire(timeout=5) as held:
        print(held.remaining)
    detached: asynclock.MultiLease = await accounts.acquire(timeout=0, detached=True)
    await detached.release()
    return tokens
