"""``locks.break_lock(name)``: an operator force-releases a stuck lock, on real servers of every backend.

A holder that keeps renewing would hold forever; after the break its body
is cancelled with ``LockLost`` (at its next renewal at the latest), the
waiter gets the lock with a larger token, and a WARNING names who held it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

import asynclock
from asynclock import LockLost, LossReason
from asynclock.backends.postgres import advisory_key
from tests.conftest import make_harness
from tests.harnesses import Harness
from tests.harnesses.postgres import PostgresHarness, pg_listener, pg_running
from tests.servers import scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Every backend's own way of breaking a lock (Sentinel runs one Redis's).
BREAKING = ["memory", "redis", "redis+cluster", "redlock", "zookeeper", "etcd", "postgres"]


@pytest.fixture(params=BREAKING)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, request.param) as h:
        yield h


class Stuck:
    """A task that holds ``name`` and never lets go by itself (its watchdog keeps renewing)."""

    def __init__(self, locks: asynclock.Locks, name: str) -> None:
        self.name = name
        self.inside = asyncio.Event()
        self.lease: asynclock.Lease | None = None
        self.task = asyncio.create_task(self._run(locks, name))

    async def _run(self, locks: asynclock.Locks, name: str) -> None:
        async with locks.lock(name) as lease:
            self.lease = lease
            self.inside.set()
            await asyncio.sleep(3600)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _waiting(lock: asynclock.Lock, harness: Harness) -> None:
    """Until the server counts a waiter (where it counts them), or a moment for the waiter to subscribe."""
    if harness.kind in ("redis+cluster", "redlock", "memory"):
        await asyncio.sleep(scaled(0.2))  # (no queue on the server: the waiter listens for the release)
        return
    async with asyncio.timeout(scaled(5)):
        while not (await lock.info()).waiters:
            await asyncio.sleep(0.01)


async def test_a_break_cancels_the_holder_and_hands_the_lock_on_with_a_larger_token(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    holder, waiter, operator = (harness.connect(ttl=TTL) for _ in range(3))
    stuck = Stuck(holder, "stuck")
    await asyncio.wait_for(stuck.inside.wait(), scaled(5))
    assert stuck.lease is not None
    await asyncio.sleep(TTL)  # renewed past its ttl: it would hold forever
    assert not stuck.task.done()
    shown = await operator.lock("stuck").info()
    got = asyncio.create_task(waiter.lock("stuck").acquire(detached=True))
    await _waiting(operator.lock("stuck"), harness)
    assert not got.done()

    with caplog.at_level(logging.WARNING, logger="asynclock"):
        broken = await operator.break_lock("stuck")
    assert broken is not None
    assert broken.owner == shown.owner and broken.token == shown.token == stuck.lease.token
    # the holder's body is cancelled when it finds out: at its next renewal at the latest
    with pytest.raises(LockLost) as lost:
        await asyncio.wait_for(stuck.task, TTL + scaled(3))
    assert lost.value.loss == LossReason.TAKEN_OR_EXPIRED
    lease = await asyncio.wait_for(got, scaled(5))
    if broken.token is not None:
        assert lease.token is not None and lease.token > broken.token
    else:
        assert harness.kind == "redlock" and lease.token is None
    said = [r.getMessage() for r in caplog.records if r.name == "asynclock" and "broken by client" in r.getMessage()]
    assert len(said) == 1 and f"held by {shown.owner}" in said[0] and operator.client_id in said[0]
    assert (await operator.lock("stuck").info()).owner != shown.owner
    await lease.release()


async def test_a_free_lock_or_another_owner_is_left_alone(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    holder, operator = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    with caplog.at_level(logging.WARNING, logger="asynclock"):
        assert await operator.break_lock("idle") is None
        lease = await holder.lock("idle").acquire()
        assert await operator.break_lock("idle", owner="somebody-else") is None
    assert not [r for r in caplog.records if "broken by client" in r.getMessage()]
    await asyncio.sleep(TTL / 2)
    assert not lease.lost and (await operator.lock("idle").info()).owner is not None
    shown = await operator.lock("idle").info()
    assert (await operator.break_lock("idle", owner=shown.owner)) is not None
    # with nobody waiting the lock is free now, and the next token is still larger
    again = await operator.lock("idle").acquire(timeout=scaled(2))
    if lease.token is not None:
        assert again.token is not None and again.token > lease.token
    await again.release()
    async with asyncio.timeout(TTL + scaled(3)):
        await lease.wait_lost()


def _gate_the_read(
    harness: Harness, operator: asynclock.Locks, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the operator's break between its read of the holder and the break itself: set the first
    event once the read is done, wait for the second before going on."""
    read, go = asyncio.Event(), asyncio.Event()

    def gated(original: Any) -> Any:
        async def reading(*args: Any, **kwargs: Any) -> Any:
            found = await original(*args, **kwargs)
            read.set()
            await go.wait()
            return found

        return reading

    if harness.kind == "zookeeper":
        from asynclock.backends.zookeeper import _breaking

        monkeypatch.setattr(_breaking, "describe", gated(_breaking.describe))
    elif harness.kind == "postgres":
        inspector = pg_running(operator).inspector  # type: ignore[union-attr]
        monkeypatch.setattr(inspector, "holders", gated(inspector.holders))
    else:
        monkeypatch.setattr(operator.backend, "info", gated(operator.backend.info))
    return read, go


async def test_a_holder_that_lets_go_while_it_is_broken_leaves_the_next_holder_alone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder, waiter, operator = (harness.connect(ttl=TTL) for _ in range(3))
    await operator.open()
    lease = await holder.lock("race").acquire()
    got = asyncio.create_task(waiter.lock("race").acquire(detached=True))
    await _waiting(operator.lock("race"), harness)
    read, go = _gate_the_read(harness, operator, monkeypatch)
    breaking = asyncio.create_task(operator.break_lock("race"))
    await asyncio.wait_for(read.wait(), scaled(5))  # it read the holder...
    await lease.release()  # ...which lets go: the waiter takes the lock
    taken = await asyncio.wait_for(got, scaled(5))
    go.set()
    assert await asyncio.wait_for(breaking, scaled(10)) is None
    await asyncio.sleep(TTL)  # past a renewal: a break would have been found out
    assert not taken.lost
    await taken.release()


async def test_breaking_a_hold_of_the_same_client_loses_it_at_once(harness: Harness) -> None:
    locks = harness.connect(ttl=scaled(30))  # no renewal comes before the test ends
    lease = await locks.lock("mine").acquire()
    broken = await locks.break_lock("mine")
    assert broken is not None and broken.owner is not None
    assert lease.lost
    with pytest.raises(asynclock.NotHeld):
        await lease.release()
    other = await harness.connect(ttl=TTL).lock("mine").acquire(timeout=scaled(2))
    await other.release()


async def test_a_backend_that_cannot_break_says_so() -> None:
    class Bare:
        scheme = "bare"

    with pytest.raises(NotImplementedError, match="the bare backend cannot break a lock"):
        await asynclock.Locks(Bare()).break_lock("x")  # type: ignore[arg-type]
    async with asynclock.connect("memory://") as locks:
        with pytest.raises(ValueError):
            await locks.break_lock("")
        with pytest.raises(TypeError):
            await locks.break_lock("x", owner="")


# -- PostgreSQL: a holder's client that cannot answer, and a holder that is not asynclock ------


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> AsyncIterator[PostgresHarness]:
    harness = make_harness(request, "postgres")
    assert isinstance(harness, PostgresHarness)
    async with harness:
        yield harness


async def test_a_postgres_holder_that_is_not_asynclock_has_its_session_ended(pg: PostgresHarness) -> None:
    operator, waiter = pg.connect(ttl=TTL), pg.connect(ttl=TTL)
    key = advisory_key(pg.prefix, "raw")
    raw = await asyncpg.connect(pg.server.dsn)
    try:
        await raw.execute("SELECT pg_advisory_lock($1::int4, $2::int4)", *key)
        got = asyncio.create_task(waiter.lock("raw").acquire(detached=True))
        await _waiting(operator.lock("raw"), pg)
        broken = await operator.break_lock("raw")
        assert broken is not None and broken.owner is not None and f"pid {raw.get_server_pid()}" in broken.owner
        lease = await asyncio.wait_for(got, scaled(5))  # told at once, not at its next look
        assert not await _session_alive(pg, raw.get_server_pid())
        await lease.release()
    finally:
        raw.terminate()


async def _session_alive(pg: PostgresHarness, pid: int) -> bool:
    """Whether the server still has the session ``pid``, asked on a connection of its own (the
    ended session's own client may be in any state), after the server had a moment to end it."""
    admin = await asyncpg.connect(pg.server.dsn)
    try:
        for _ in range(50):
            if not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
                return False
            await asyncio.sleep(scaled(0.02))
        return True
    finally:
        await admin.close()


async def test_a_postgres_holder_whose_client_does_not_answer_has_its_session_ended(pg: PostgresHarness) -> None:
    holder, operator = pg.connect(ttl=scaled(10)), pg.connect(ttl=TTL)
    stuck = Stuck(holder, "deaf")
    await asyncio.wait_for(stuck.inside.wait(), scaled(5))
    pid = await pg.holder_pid("deaf")
    assert pid is not None
    pg_listener(holder).on_message = lambda payload: None  # its client hears nothing more: it cannot answer
    loop = asyncio.get_running_loop()
    started = loop.time()
    broken = await operator.break_lock("deaf")
    assert broken is not None and loop.time() - started >= 1.5  # it waited for an answer first
    assert await pg.holder_pid("deaf") != pid
    with pytest.raises(LockLost) as lost:
        await asyncio.wait_for(stuck.task, scaled(5))
    assert lost.value.loss == LossReason.CONNECTION_LOST  # its session was ended


# -- asynclock break URL NAME [--yes] -------------------------------------------------------


async def _cli(*args: str, stdin: int = subprocess.DEVNULL) -> tuple[int, str, str]:
    """Run ``asynclock break ARGS`` in a process of its own; its exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asynclock",
        "break",
        *args,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), scaled(60))
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture(params=[kind for kind in BREAKING if kind != "memory"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A harness of each server backend (a memory:// lock lives in one process: the command cannot see it)."""
    async with make_harness(request, request.param) as h:
        yield h


async def test_the_command_with_yes_shows_the_holder_and_breaks_it(server: Harness) -> None:
    holder, other = server.connect(ttl=TTL), server.connect(ttl=TTL)
    stuck = Stuck(holder, "jobs:nightly")
    await asyncio.wait_for(stuck.inside.wait(), scaled(5))
    assert stuck.lease is not None
    shown = await other.lock("jobs:nightly").info()
    status, out, err = await _cli(server.url, "jobs:nightly", "--yes", "--prefix", server.prefix)
    assert status == 0, err
    assert shown.owner is not None and shown.owner in out and "broken: lock 'jobs:nightly' was taken from" in out
    assert "broken by client" in err and f"held by {shown.owner}" in err  # the WARNING of the asynclock logger
    with pytest.raises(LockLost):
        await asyncio.wait_for(stuck.task, TTL + scaled(3))
    lease = await other.lock("jobs:nightly").acquire(timeout=scaled(5))
    if stuck.lease.token is not None:
        assert lease.token is not None and lease.token > stuck.lease.token
    await lease.release()


async def _still_held(locks: asynclock.Locks, stuck: Stuck, owner: str | None) -> None:
    await asyncio.sleep(TTL)  # past a renewal: a break would have been found out
    assert not stuck.task.done() and stuck.lease is not None and not stuck.lease.lost
    assert (await locks.lock(stuck.name).info()).owner == owner


@pytest.fixture
async def redis(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with make_harness(request, "redis") as h:
        yield h


async def test_with_no_terminal_and_no_yes_the_command_refuses_and_changes_nothing(redis: Harness) -> None:
    holder, other = redis.connect(ttl=TTL), redis.connect(ttl=TTL)
    stuck = Stuck(holder, "report")
    await asyncio.wait_for(stuck.inside.wait(), scaled(5))
    shown = await other.lock("report").info()
    status, out, err = await _cli(redis.url, "report", "--prefix", redis.prefix)
    assert status == 3
    assert shown.owner is not None and shown.owner in out  # it showed the holder
    assert "not broken: there is no terminal to ask on; add --yes" in err and "broken by client" not in err
    await _still_held(other, stuck, shown.owner)
    await stuck.stop()


@pytest.mark.parametrize("answer", [b"n\n", b"\n", b"y\n"])
async def test_on_a_terminal_the_command_asks_and_breaks_only_on_yes(redis: Harness, answer: bytes) -> None:
    holder, other = redis.connect(ttl=TTL), redis.connect(ttl=TTL)
    stuck = Stuck(holder, "report")
    await asyncio.wait_for(stuck.inside.wait(), scaled(5))
    shown = await other.lock("report").info()
    terminal, tty = pty.openpty()
    try:
        os.write(terminal, answer)  # typed ahead: the command reads it once it asks
        status, out, err = await _cli(redis.url, "report", "--prefix", redis.prefix, stdin=tty)
    finally:
        os.close(tty)
        os.close(terminal)
    assert f"Break lock 'report', held by {shown.owner}? [y/N]" in out
    if answer == b"y\n":
        assert status == 0 and "broken: lock 'report'" in out, err
        with pytest.raises(LockLost):
            await asyncio.wait_for(stuck.task, TTL + scaled(3))
    else:
        assert status == 3 and "not broken" in out and "broken by client" not in err
        await _still_held(other, stuck, shown.owner)
        await stuck.stop()


async def test_the_command_on_a_free_lock_breaks_nothing(redis: Harness) -> None:
    status, out, err = await _cli(redis.url, "idle", "--yes", "--prefix", redis.prefix)
    assert status == 0 and "lock 'idle' is not held: nothing to break" in out and not err


async def test_the_command_on_a_server_that_is_not_there_fails_with_status_1() -> None:
    status, _, err = await _cli("redis://127.0.0.1:1/0", "x", "--yes", "--timeout", "3")
    assert status == 1 and err.startswith("asynclock break: ") and "127.0.0.1:1" in err
