"""The fault harness, fast tier: worker processes, injected faults, the checker.

Each scenario runs a few worker processes for a few seconds against a real
server, injects its fault a couple of times and fails on any violation the
checker finds (see ``tests/faults``). The torture tier (``--run-slow``, or
``python -m tests.faults``) runs the same scenarios longer and with more workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asynclock
from tests.faults import hygiene
from tests.faults.checker import LATE_CANCEL_SLACK, LATE_GRANT, Section, StaleWindow, WorkerLog, check
from tests.faults.election import memory_election
from tests.faults.runner import RedlockTarget, SentinelTarget, Target, target_for
from tests.faults.scenarios import SCENARIOS, Outcome, Settings, _warned_first, by_name
from tests.faults.store import StoreState
from tests.servers import RedisServer
from tests.servers.base import SCALE
from tests.servers.etcd import EtcdServer
from tests.servers.mysql import MariaDBServer
from tests.servers.postgres import PostgresServer
from tests.servers.redis_topologies import RedisNodes, SentinelSetup
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.anyio

FAST = Settings(workers=3, duration=3.0, ttl=0.6, faults=2, margin=1.0)

#: scenarios of the fast tier per backend (the torture command runs all that apply)
FAST_SCENARIOS = {
    "redis": [s.name for s in SCENARIOS if s.kinds is None or "redis" in s.kinds],
    "zookeeper": ["cancellation", "holder-killed", "holder-frozen", "partition", "server-frozen", "server-restarted"],
    "postgres": ["cancellation", "holder-killed", "holder-frozen", "partition", "server-frozen", "server-restarted"],
    "mysql": [
        "cancellation",
        "holder-killed",
        "holder-frozen",
        "partition",
        "server-frozen",
        "server-restarted",
        "session-killed",
    ],
    "redlock": ["cancellation", "holder-killed", "redlock-minority", "redlock-majority"],
    "sentinel": ["failover"],
    "memory": ["renewals-stalled"],
}
#: the election workload (each critical section a term of leadership) on the backends that
#: have elections: a crash, a pause and a session loss of the leader
ELECTION_SCENARIOS = {
    "zookeeper": ["holder-killed", "holder-frozen", "partition"],
    "etcd": ["holder-killed", "holder-frozen"],
    "redis": ["holder-frozen"],
    "postgres": ["holder-frozen"],
    "mysql": ["holder-killed", "holder-frozen", "session-killed"],
}
#: the torture tier: every scenario that applies, longer, with more workers
TORTURE = Settings(workers=6, duration=15.0, ttl=1.0, faults=10_000, margin=1.0)
#: (backend, scenario) -> reason, for a bug found and not fixed yet (xfail, not strict)
KNOWN_BUGS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def store_server() -> Iterator[RedisServer]:
    """The fenced store's own redis-server (never the lock server)."""
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def fault_redis() -> Iterator[RedisServer]:
    """A redis-server that these tests may freeze, restart and flush."""
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def fault_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL that these tests may freeze and restart. Commits are synchronous here
    (the session server's are not, for speed): with ``synchronous_commit=off`` a crash
    loses the last commits, token increments included, and a token comes again."""
    server = PostgresServer(extra=["-c", "synchronous_commit=on"])
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def fault_mysql() -> Iterator[MariaDBServer]:
    """A MariaDB that these tests may freeze, restart and whose sessions they KILL (each commit
    flushed: a crash loses no token increment)."""
    server = MariaDBServer(extra=["--innodb-flush-log-at-trx-commit=1"])
    server.start(timeout=60)
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def fault_redlock() -> Iterator[RedisNodes]:
    """Three redis-servers for Redlock that these tests may kill and start again."""
    nodes = RedisNodes(3)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.cleanup()


@pytest.fixture(scope="module")
def fault_sentinel() -> Iterator[SentinelSetup]:
    """A primary, a replica and three sentinels, for failovers."""
    setup = SentinelSetup()
    try:
        setup.start()
        yield setup
    finally:
        setup.cleanup()


#: every outcome of this module's runs, for the summary line at the end
_OUTCOMES: list[Outcome] = []


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the figures of the runs (operations, faults injected, violations) at the end."""
    yield
    if not _OUTCOMES:
        return
    total = sum((o.verdict.operations for o in _OUTCOMES), 0)
    faults = sum(o.faults for o in _OUTCOMES)
    violations = sum(len(o.verdict.violations) for o in _OUTCOMES)
    line = f"fault harness: {len(_OUTCOMES)} scenario runs, {total} operations, {faults} faults injected, "
    line += f"{violations} violations"
    fenced = sum(o.verdict.fenced for o in _OUTCOMES)
    refused = sum(o.verdict.fenced_refused for o in _OUTCOMES)
    line += f"; {fenced} fenced writes applied, {refused} stale ones refused by the store"
    stalled = [o.verdict for o in _OUTCOMES if o.stalled]
    lost = sum(v.renewal_losses for v in stalled)
    unwarned = sum(v.unwarned for v in stalled)
    line += f"; stalled renewals: {lost} leases lost, {unwarned} of them without an earlier at_risk"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)
    _OUTCOMES.clear()


def _report(outcome: Outcome) -> None:
    _OUTCOMES.append(outcome)
    print(outcome.line(), *outcome.notes)
    assert outcome.ok, "\n".join(outcome.verdict.violations)


async def _target(request: pytest.FixtureRequest, kind: str) -> Target:
    if kind == "memory":
        return target_for("memory://")
    if kind == "redlock":
        nodes: RedisNodes = request.getfixturevalue("fault_redlock")
        nodes.revive()
        return RedlockTarget(nodes.url, nodes)
    if kind == "sentinel":
        setup: SentinelSetup = request.getfixturevalue("fault_sentinel")
        return SentinelTarget(setup.url, setup)
    if kind == "redis":
        server: RedisServer | ZooKeeperServer | PostgresServer | EtcdServer | MariaDBServer = request.getfixturevalue(
            "fault_redis"
        )
    elif kind == "zookeeper":
        server = request.getfixturevalue("zookeeper_server")
    elif kind == "etcd":
        server = request.getfixturevalue("etcd_server")
    elif kind == "mysql":
        server = request.getfixturevalue("fault_mysql")
    else:
        server = request.getfixturevalue("fault_postgres")
    return target_for(server.url, server)


@pytest.mark.parametrize(
    ("kind", "scenario"),
    [
        pytest.param(
            kind,
            name,
            marks=[pytest.mark.xfail(reason=KNOWN_BUGS[kind, name], strict=False)]
            if (kind, name) in KNOWN_BUGS
            else [],
        )
        for kind, names in FAST_SCENARIOS.items()
        for name in names
    ],
)
async def test_fault_scenario(
    request: pytest.FixtureRequest, kind: str, scenario: str, store_server: RedisServer, tmp_path: Path
) -> None:
    target = await _target(request, kind)
    try:
        chosen = by_name(scenario)
        assert chosen.applies(target)
        _report(await chosen.run(target, store_server.url, tmp_path, FAST))
    finally:
        await target.aclose()


@pytest.mark.parametrize(
    ("kind", "scenario"), [(kind, name) for kind, names in ELECTION_SCENARIOS.items() for name in names]
)
async def test_election_fault_scenario(
    request: pytest.FixtureRequest, kind: str, scenario: str, store_server: RedisServer, tmp_path: Path
) -> None:
    """Workers are candidates of one election: 0 overlapping terms, 0 term-token inversions."""
    target = await _target(request, kind)
    try:
        chosen = by_name(scenario)
        assert chosen.applies(target)
        _report(await chosen.run(target, store_server.url, tmp_path, dataclasses.replace(FAST, workload="election")))
    finally:
        await target.aclose()


async def test_election_faults_on_memory(store_server: RedisServer, tmp_path: Path) -> None:
    """Candidates in one process (memory:// is per process): the leader's term lost, its
    renewals stalled past the ttl, its task cancelled mid-term; no overlap, tokens increase."""
    _report(await memory_election(store_server.url, tmp_path, dataclasses.replace(FAST, faults=6)))


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FAST_SCENARIOS))
async def test_torture(request: pytest.FixtureRequest, kind: str, store_server: RedisServer, tmp_path: Path) -> None:
    """Every scenario that applies to the backend, 15 s each with 6 workers."""
    target = await _target(request, kind)
    try:
        failures = []
        for scenario in SCENARIOS:
            if scenario.applies(target):
                outcome = await scenario.run(target, store_server.url, tmp_path, TORTURE)
                _OUTCOMES.append(outcome)
                print(outcome.line(), *outcome.notes)
                failures += [f"{scenario.name}: {v}" for v in outcome.verdict.violations]
        assert not failures, "\n".join(failures)
    finally:
        await target.aclose()


async def test_failover_with_replicas_confirmed(
    fault_sentinel: SentinelSetup, store_server: RedisServer, tmp_path: Path
) -> None:
    """The failover scenario with every acquire and renewal confirmed by the replica
    (``?replicas=1``): the promoted replica has every hold, so nobody may overlap
    the old holder at all, not even in the failover's window."""
    target = SentinelTarget(f"{fault_sentinel.url}?replicas=1", fault_sentinel)
    try:
        outcome = await by_name("failover").run(target, store_server.url, tmp_path, FAST)
        _report(outcome)
        assert outcome.verdict.overlaps_allowed == 0, "an overlap although the replica confirmed every hold"
    finally:
        await target.aclose()


@pytest.mark.slow
async def test_torture_zookeeper_ensemble(store_server: RedisServer, tmp_path: Path) -> None:
    """The leader of a three-server ensemble killed or frozen again and again."""
    from tests.faults.runner import ZooKeeperTarget
    from tests.servers.zookeeper import ZooKeeperEnsemble

    ensemble = ZooKeeperEnsemble()
    await asyncio.to_thread(ensemble.start)
    target = ZooKeeperTarget(ensemble.url, ensemble=ensemble)
    try:
        outcome = await by_name("leader-lost").run(target, store_server.url, tmp_path, TORTURE)
        _report(outcome)
    finally:
        await asyncio.to_thread(ensemble.cleanup)


async def test_the_checker_catches_a_lock_that_does_not_exclude(store_server: RedisServer, tmp_path: Path) -> None:
    """memory:// in separate processes gives every worker its own lock: the harness must say so."""
    target = target_for("memory://")
    outcome = await by_name("cancellation").run(target, store_server.url, tmp_path, Settings(workers=3, duration=1.5))
    found = "\n".join(outcome.verdict.violations)
    assert "overlap" in found
    assert "token order" in found


# -- the checker on hand-made journals ---------------------------------------------


def _section(worker: int, start: float, end: float, token: int, **kw: str) -> Section:
    return Section(worker, int(start * 10), start, end, token, kw.get("read", "ok"), kw.get("write", "ok"), "ok")


def _logs(*sections: Section) -> list[WorkerLog]:
    logs: dict[int, WorkerLog] = {}
    for section in sections:
        log = logs.setdefault(section.worker, WorkerLog(section.worker, done=True))
        log.sections.append(section)
    return list(logs.values())


def _store(writes: int, counter: int | None = None, refused: int = 0) -> StoreState:
    log = tuple(("write", i + 1, "w") for i in range(writes))
    return StoreState(writes if counter is None else counter, writes, refused, log)


def test_checker_accepts_a_clean_history() -> None:
    verdict = check(_logs(_section(0, 1.0, 1.1, 5), _section(1, 1.2, 1.3, 6), _section(0, 1.4, 1.5, 9)), _store(3))
    assert verdict.violations == []
    assert verdict.sections == 3


def test_checker_finds_an_overlap_unless_a_stale_window_explains_it() -> None:
    logs = _logs(_section(0, 1.0, 1.3, 5), _section(1, 1.2, 1.4, 6))
    assert any("overlap" in v for v in check(logs, _store(2)).violations)
    allowed = check(logs, _store(2), [StaleWindow(1.05, 1.25, worker=0)])
    assert allowed.violations == [] and allowed.overlaps_allowed == 1
    # a window on another worker does not excuse it
    assert any("overlap" in v for v in check(logs, _store(2), [StaleWindow(1.05, 1.25, worker=1)]).violations)


def test_checker_ends_a_section_lost_at_its_deadline_there_only_if_its_body_saw_that_soon() -> None:
    """A body cancelled at its deadline but run a little late (a loaded machine) ends at the
    deadline; a body that ran on well past its deadline, or whose deadline was past the next
    holder's start (the library trusting too long), overlaps; so does a section not lost."""

    def lost(end: float, deadline: float | None) -> Section:
        return dataclasses.replace(_section(0, 1.0, end, 5), outcome="lost", deadline=deadline)

    slack = LATE_CANCEL_SLACK * SCALE
    nxt = _section(1, 1.3, 1.4, 6)
    late = check(_logs(lost(1.3 + slack / 2, 1.29), nxt), _store(2))
    assert late.violations == [] and late.late_cancels == 1
    ran_on = check(_logs(lost(1.29 + 2 * slack, 1.29), nxt), _store(2))
    assert any("overlap" in v for v in ran_on.violations) and ran_on.late_cancels == 0
    trusted_too_long = check(_logs(lost(1.32, 1.31), nxt), _store(2))
    assert any("overlap" in v for v in trusted_too_long.violations)
    not_lost = check(_logs(dataclasses.replace(lost(1.31, 1.29), outcome="ok"), nxt), _store(2))
    assert any("overlap" in v for v in not_lost.violations)
    unrecorded = check(_logs(lost(1.31, None), nxt), _store(2))
    assert any("overlap" in v for v in unrecorded.violations)


def test_checker_finds_tokens_out_of_real_time_order() -> None:
    verdict = check(_logs(_section(0, 1.0, 1.1, 7), _section(1, 1.2, 1.3, 7)), _store(2))
    assert any("token order" in v for v in verdict.violations)


def test_checker_finds_a_lost_update_and_unexplained_refusals() -> None:
    assert any("lost update" in v for v in check(_logs(_section(0, 1.0, 1.1, 5)), _store(1, counter=0)).violations)
    refused = _section(0, 1.0, 1.1, 5, write="refused")
    verdict = check(_logs(refused), StoreState(0, 0, 1, ()))
    assert any("refused op" in v for v in verdict.violations)


def test_checker_finds_a_stale_fenced_write_applied_and_unexplained_fenced_refusals() -> None:
    logs = _logs(
        dataclasses.replace(_section(0, 1.0, 1.1, 5), fenced="ok"),
        dataclasses.replace(_section(1, 1.2, 1.3, 6), fenced="ok", late="refused"),
    )
    clean = check(logs, dataclasses.replace(_store(2), fenced=((5, "w0"), (6, "w1"))))
    assert clean.violations == [] and (clean.fenced, clean.fenced_refused) == (2, 1)
    # the store applied the older holder's write after the newer one's
    stale = check(logs, dataclasses.replace(_store(2), fenced=((6, "w1"), (5, "w0"))))
    assert any("fenced write from a stale holder was applied: token 5" in v for v in stale.violations)
    # a write the store applied that no worker saw go out
    extra = check(logs, dataclasses.replace(_store(2), fenced=((5, "w0"), (6, "w1"), (7, "w2"))))
    assert any("the workers saw 2 fenced writes applied" in v for v in extra.violations)
    # the store refused a lease's write outside any stale window: a token went backwards
    refused = _logs(dataclasses.replace(_section(0, 1.0, 1.1, 5), fenced="refused"))
    assert any("fenced write refused" in v for v in check(refused, _store(1)).violations)
    assert check(refused, _store(1), [StaleWindow(1.0, 1.05, worker=0)]).violations == []


def test_checker_ends_a_killed_holder_at_its_kill_and_flags_a_worker_that_vanished() -> None:
    killed = WorkerLog(0)
    killed.add({"ev": "start", "sid": 1, "t": 1.0, "token": 5})
    killed.close_killed(1.5)
    other = WorkerLog(1, done=True, sections=[_section(1, 1.4, 1.6, 6)])
    assert any("overlap" in v for v in check([killed, other], _store(1), killed=[0]).violations)
    vanished = WorkerLog(2)
    assert any("did not finish" in v for v in check([vanished], _store(0)).violations)


def test_checker_ends_a_killed_holder_whose_body_was_over_where_it_ended() -> None:
    """Killed while its release was under way (the next holder already in): its section
    ended where its body did, not at the kill; a start before that is still an overlap."""
    killed = WorkerLog(0)
    killed.add({"ev": "start", "sid": 1, "t": 1.0, "token": 5})
    killed.add({"ev": "end", "sid": 1, "t": 1.3})
    killed.close_killed(1.5)
    assert killed.sections[0].end == 1.3
    handed = WorkerLog(1, done=True, sections=[_section(1, 1.4, 1.6, 6)])
    assert check([killed, handed], _store(1), killed=[0]).violations == []
    early = WorkerLog(1, done=True, sections=[_section(1, 1.2, 1.6, 6)])
    assert any("overlap" in v for v in check([killed, early], _store(1), killed=[0]).violations)


def test_checker_tells_a_starved_waiter_of_a_non_fair_lock_from_a_lock_that_stood_still() -> None:
    others = [_section(1, 2.0 + i, 2.5 + i, 5 + i) for i in range(4)]
    starved = WorkerLog(0, done=True)
    starved.add({"ev": "stuck", "asked": 1.5, "t": 9.0, "what": "waited", "tasks": ""})
    verdict = check([starved, *_logs(*others)], _store(4))
    assert verdict.violations == [] and verdict.starved == 1
    # the same wait while the lock changed hands only twice: the lock stood still
    verdict = check([starved, *_logs(*others[:2])], _store(2))
    assert any("changed hands only 2 times" in v for v in verdict.violations) and verdict.starved == 0


# -- a bug the fault harness found, pinned down in one process ----------------------


async def test_zookeeper_lease_lost_on_a_session_that_survives_gives_the_lock_back(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """The holder's event loop stalls until just past its session timeout (as a frozen
    process would); its lease is lost, so the lock must become free for others
    within a few ttl, whether or not the server expired the session.

    Found by the holder-frozen scenario: release() used to forget the node of a
    session past its timeout by the client's clock without deleting it, but the
    server had not expired the session yet, the next ping revived it, and the
    lock stayed held until the process exited."""
    ttl = 0.6
    stalled = 0
    for attempt, stall in enumerate([0.43, 0.44, 0.45, 0.46] * 2):
        prefix = f"orphan{attempt}"
        async with asynclock.connect(zookeeper_server.url, ttl=ttl, prefix=prefix) as holder:
            lease = await holder.lock("x").acquire()
            renewed = lease.expires_at
            while lease.expires_at == renewed:  # just after a renewal ...
                await asyncio.sleep(0.005)
            await asyncio.sleep(ttl / 3 - 0.03)  # ... and just before the next one
            before = lease.expires_at
            time.sleep(stall)  # the stall is the point: nothing of this loop runs
            await asyncio.sleep(0.05)
            if not lease.lost and lease.expires_at != before:
                # This loop woke late (a loaded machine) and sent the next renewal just before
                # the stall; answered during it, it rightly renewed the lease: no stall past it.
                continue
            assert lease.lost
            stalled += 1
            seen: list[object] = []
            other = threading.Thread(target=_try_acquire, args=(zookeeper_server.url, prefix, ttl, seen))
            other.start()
            while other.is_alive():
                await asyncio.sleep(0.02)
            assert seen and seen[0] == "acquired", f"stall {stall}s: the lost lock stayed held: {seen}"
    assert stalled >= 4, f"only {stalled} of 8 stalls came before a renewal went out"


def _try_acquire(url: str, prefix: str, ttl: float, seen: list[object]) -> None:
    """Another client, on its own event loop in its own thread, tries for 4 ttl."""

    async def attempt() -> None:
        async with asynclock.connect(url, ttl=ttl, prefix=prefix) as other:
            lock = other.lock("x")
            try:
                await lock.acquire(timeout=4 * ttl)
            except asynclock.LockTimeout:
                seen.append(await lock.info())
            else:
                seen.append("acquired")
                await lock.release()

    asyncio.run(attempt())


# -- the hygiene checks can fail ---------------------------------------------------


async def test_hygiene_sees_asynclock_tasks_until_the_client_is_closed() -> None:
    locks = asynclock.connect("memory://", ttl=5.0, prefix="hygiene")
    async with locks.lock("h"):
        assert any("lease-keeper" in task for task in await hygiene.pending_asynclock_tasks(grace=0))
    await locks.aclose()
    assert await hygiene.pending_asynclock_tasks(grace=0) == []


def test_hygiene_sees_a_task_exception_never_retrieved() -> None:
    async def fail() -> None:
        raise RuntimeError("nobody looks at me")

    # asyncio's report, sent to a logger of this test's own (the autouse
    # fixture watches "asyncio" and would rightly fail this test otherwise)
    selftest = logging.getLogger("asynclock-hygiene-selftest")
    selftest.propagate = False

    def report(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        selftest.error(context["message"], exc_info=context.get("exception"))

    with hygiene.NeverRetrieved(selftest.name) as never_retrieved:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(report)
        try:
            loop.run_until_complete(asyncio.sleep(0, loop.create_task(fail())))
            loop.run_until_complete(asyncio.sleep(0))
        finally:
            loop.close()
    assert any("never retrieved" in found and "nobody looks at me" in found for found in never_retrieved.found)


async def test_hygiene_counts_postgres_client_connections(postgres_server: PostgresServer) -> None:
    """A connection left open is one more client backend; closed, the count settles back."""
    import asyncpg

    before = await asyncio.to_thread(hygiene.postgres_connections, postgres_server.dsn)
    conn = await asyncpg.connect(postgres_server.dsn)
    try:
        assert await asyncio.to_thread(hygiene.postgres_connections, postgres_server.dsn) == before + 1
    finally:
        await conn.close()
    settled = await asyncio.to_thread(
        hygiene.wait_connections, lambda: hygiene.postgres_connections(postgres_server.dsn), before
    )
    assert settled == before


def test_checker_counts_leases_lost_to_failing_renewals_without_an_earlier_at_risk() -> None:
    log = WorkerLog(0, done=True)
    log.add({"ev": "at_risk", "t": 1.0, "reason": "a renewal did not answer within half the time left"})
    log.add({"ev": "lost", "t": 1.2, "loss": "renewal_failed", "warned": True})
    log.add({"ev": "lost", "t": 2.0, "loss": "renewal_failed", "warned": False})
    log.add({"ev": "lost", "t": 2.5, "loss": "connection_lost", "warned": True})
    log.add({"ev": "lost", "t": 3.0, "loss": "taken_or_expired", "warned": False})  # the server said so: no warning
    verdict = check([log], _store(0))
    assert (verdict.renewal_losses, verdict.unwarned) == (3, 1)
    assert verdict.violations == []  # a count; a violation only where the fault stalled renewals
    outcome = _warned_first(Outcome("renewals stalled", "memory", verdict, faults=1))
    assert outcome.stalled and "at_risk first 2/3" in outcome.line()
    assert outcome.verdict.violations == ["1 of 3 leases lost to failing renewals without an earlier at_risk"]


def test_checker_takes_a_body_started_past_its_deadline_for_a_paused_process() -> None:
    """A body that starts after its lease's deadline (its process did not run between the
    grant and the body) is in a stale window of its own: an overlap with it, and the store
    refusing its write, are allowed and counted, and its loss needs no at_risk first (no
    renewal was due). A loss of a section that started in time still needs one."""
    log = WorkerLog(0, done=True)
    for event in (
        {"ev": "section", "sid": 1, "start": 1.0, "end": 1.05, "deadline": 0.9, "token": 5, "read": "ok"},
        {"ev": "lost", "t": 1.06, "loss": "renewal_failed", "warned": False},
        {"ev": "section", "sid": 2, "start": 2.0, "end": 2.5, "deadline": 2.45, "token": 7, "read": "ok"},
        {"ev": "lost", "t": 2.51, "loss": "renewal_failed", "warned": False},
    ):
        log.add({"write": "ok", "outcome": "lost", **event})
    other = WorkerLog(1, done=True)
    other.sections.append(_section(1, 1.02, 1.1, 6))
    verdict = check([log, other], _store(3))
    assert verdict.dead_on_arrival == 1 and verdict.overlaps_allowed == 1
    assert not any("overlap" in v for v in verdict.violations), verdict.violations
    assert (verdict.renewal_losses, verdict.unwarned) == (2, 1)
    # a grant answered just before its deadline: no renewal was due to warn of either
    barely = WorkerLog(0, done=True)
    for event in (
        {"ev": "section", "sid": 1, "start": 1.0, "end": 1.02, "deadline": 1.0 + LATE_GRANT * SCALE / 2, "token": 5},
        {"ev": "lost", "t": 1.03, "loss": "renewal_failed", "warned": False},
        {"ev": "section", "sid": 2, "start": 2.0, "end": 2.5, "deadline": 2.0 + 2 * LATE_GRANT * SCALE, "token": 7},
        {"ev": "lost", "t": 2.51, "loss": "renewal_failed", "warned": False},
    ):
        barely.add({"read": "ok", "write": "ok", "outcome": "lost", **event})
    assert check([barely], _store(2)).unwarned == 1
    in_time = dataclasses.replace(log.sections[0], deadline=1.2)
    assert any("overlap" in v for v in check(_logs(in_time, other.sections[0]), _store(2)).violations)
