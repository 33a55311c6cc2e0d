"""Leader election in the front, on every backend that has it (memory://, etcd, Redis, PostgreSQL;
the ZooKeeper specifics are in ``test_election_zookeeper.py``, etcd's ``etcdctl elect``
interop in ``test_etcd.py``, the model of ``observe()`` in ``test_model_election.py``).

Candidates wait in line and lead one at a time with increasing tokens; a
resign ends the body quietly and hands leadership on at once (not after a
ttl); a loss cancels the body with LockLost; cancelled and abandoned
candidates leave nothing behind; ``leader()`` and ``observe()`` need no
candidacy; a graceful hand-over (a resign, a drained close) to a candidate
in line is seen by an observer as one change, here on ZooKeeper too; a
leader's process killed or frozen is replaced, after its ttl, by a
candidate with a larger token (and the frozen one finds its term lost);
backends without elections refuse before any I/O.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
from collections.abc import AsyncIterator

import anyio
import pytest

import asynclock
import asynclock.testing
from asynclock import LockLost, LockTimeout, NotHeld
from asynclock._inspect import collect
from asynclock.backends import memory
from tests.child import CANDIDATE, ChildProcess, children
from tests.conftest import make_harness
from tests.harnesses import Harness, MemoryHarness
from tests.servers import scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.5)
#: a bound far below a long ttl: what passes within it did not wait for an expiry
PROMPT = scaled(0.5)
#: the backends with elections that these tests run on (ZooKeeper's are in their own file)
ELECTING = ["memory", "etcd", "redis", "redis+cluster", "postgres", "mysql"]


@pytest.fixture
async def mem() -> AsyncIterator[MemoryHarness]:
    harness = MemoryHarness()
    async with harness:
        yield harness
    assert not queued(harness.prefix), "a candidate was left in the line"


@pytest.fixture(params=ELECTING)
async def elect_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A harness of each backend with elections; nothing may be left in any line at the end."""
    harness = make_harness(request, request.param)
    async with harness:
        yield harness
    if request.param == "memory":
        assert not queued(harness.prefix), "a candidate was left in the line"


def queued(prefix: str) -> list[str]:
    """Keys of ``prefix`` in memory://'s queue table that still have holders or waiters."""
    with memory._QUEUES._mutex:
        return [key for key, res in memory._QUEUES._resources.items() if key.startswith(prefix + ":")]


async def in_line(election: asynclock.Election, waiters: int) -> None:
    """Wait (a test's bounded look) until ``waiters`` candidates wait behind the leader."""
    async with asyncio.timeout(scaled(5)):
        while (await election.info()).waiters != waiters:
            await asyncio.sleep(0.01)


class Candidate:
    """A task that becomes a candidate and records its term; resigns when told, or leaves the block."""

    def __init__(self, election: asynclock.Election, *, resign: bool = True) -> None:
        self.election = election
        self.led = asyncio.Event()
        self.go = asyncio.Event()
        self.term: asynclock.Term | None = None
        self.after_resign = False
        self.resign = resign
        self.ended: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async with self.election.leadership() as term:
                self.term = term
                self.led.set()
                await self.go.wait()
                if self.resign:
                    await self.election.resign()
                    self.after_resign = True  # never runs: resign() ends the body
        except BaseException as exc:
            self.ended = exc
            raise

    async def leads(self, within: float = scaled(5)) -> asynclock.Term:
        async with asyncio.timeout(within):
            await self.led.wait()
        assert self.term is not None
        return self.term


async def test_candidates_lead_one_at_a_time_in_the_order_they_asked(elect_harness: Harness) -> None:
    clients = [elect_harness.connect(ttl=scaled(10)) for _ in range(3)]
    first = Candidate(clients[0].election("sched", identity="c0"))
    term0 = await first.leads()
    others = []
    for i in (1, 2):
        others.append(Candidate(clients[i].election("sched", identity=f"c{i}")))
        await in_line(clients[0].election("sched"), i)  # (each asks after the one before)
    assert (await clients[0].election("sched").info()).waiters == 2
    assert not any(c.led.is_set() for c in others)
    first.go.set()
    term1 = await others[0].leads()
    assert not others[1].led.is_set()
    others[0].go.set()
    term2 = await others[1].leads()
    others[1].go.set()
    await asyncio.gather(first.task, *(c.task for c in others))
    assert [t.identity for t in (term0, term1, term2)] == ["c0", "c1", "c2"]
    assert term0.token is not None and term1.token is not None and term2.token is not None
    assert term0.token < term1.token < term2.token, "each term's token is larger"
    assert not any(c.after_resign for c in (first, *others)), "resign() ended each body where it was called"
    assert all(c.ended is None for c in (first, *others)), "after a resign the async with ends without an exception"


async def test_a_resign_hands_leadership_over_at_once_not_after_a_ttl(elect_harness: Harness) -> None:
    """With a 30 s ttl, the next candidate must lead within one hand-over of the resign."""
    a, b = elect_harness.connect(ttl=30), elect_harness.connect(ttl=30)
    leader = Candidate(a.election("e", identity="a"))
    await leader.leads()
    waiting = Candidate(b.election("e", identity="b"))
    await in_line(a.election("e"), 1)
    loop = asyncio.get_running_loop()
    resigned = loop.time()
    leader.go.set()
    await waiting.leads(within=PROMPT)
    assert loop.time() - resigned < PROMPT
    waiting.go.set()
    await asyncio.gather(leader.task, waiting.task)


async def test_a_body_unwinds_while_it_still_leads_after_resigning_inside(elect_harness: Harness) -> None:
    """resign() inside the body ends it there; its finally blocks still run as the leader,
    and leadership passes when the async with is left."""
    a, b = elect_harness.connect(ttl=scaled(10)), elect_harness.connect(ttl=scaled(10))
    election = a.election("e", identity="a")
    seen_in_finally: list[str | None] = []
    async with election.leadership():
        waiting = Candidate(b.election("e", identity="b"))
        await in_line(election, 1)
        try:
            await election.resign()
        finally:
            # (the body's scope is cancelled: I/O in a finally block needs a shield)
            with anyio.CancelScope(shield=True):
                leader = await b.election("e").leader()
                seen_in_finally.append(None if leader is None else leader.identity)
                await asyncio.sleep(0.02)
                seen_in_finally.append("waiting" if not waiting.led.is_set() else "led")
    assert seen_in_finally == ["a", "waiting"]
    await waiting.leads(within=PROMPT)
    waiting.go.set()
    await waiting.task


async def test_resign_from_another_task_cancels_the_body_and_ends_the_block_quietly(elect_harness: Harness) -> None:
    locks = elect_harness.connect(ttl=TTL)
    election = locks.election("e", identity="x")
    reached: list[str] = []
    entered = asyncio.Event()

    async def lead() -> str:
        async with election.leadership():
            entered.set()
            try:
                await asyncio.sleep(scaled(30))
            finally:
                reached.append("cancelled")
        return "block ended"

    task = asyncio.create_task(lead())
    await entered.wait()
    assert election.leading is False  # (this task does not lead)
    await election.resign()
    assert await asyncio.wait_for(task, scaled(5)) == "block ended"
    assert reached == ["cancelled"]
    assert await election.leader() is None
    with pytest.raises(NotHeld):
        await election.resign()


async def test_resign_without_leading_is_not_held(mem: MemoryHarness) -> None:
    locks = mem.connect(ttl=TTL)
    with pytest.raises(NotHeld):
        await locks.election("e").resign()


async def test_a_lost_term_cancels_the_body_and_raises_lock_lost(elect_harness: Harness) -> None:
    """The server takes the leader's hold away (an expiry, an administrator): its body is
    cancelled at the next renewal, with LockLost."""
    locks = elect_harness.connect(ttl=TTL)
    election = locks.election("e", identity="x")
    with pytest.raises(LockLost) as lost:
        async with election.leadership() as term:
            assert election.leading
            assert await elect_harness.expire_shape("election", "e")
            await asyncio.sleep(scaled(30))
    # (PostgreSQL and MySQL take a hold away by ending its session: the client sees its connection close)
    expected = "CONNECTION_LOST" if elect_harness.kind in ("postgres", "mysql") else "TAKEN_OR_EXPIRED"
    assert lost.value.loss is asynclock.LossReason[expected]
    assert term.lost and not election.leading


async def test_a_stalled_leader_loses_and_the_next_candidate_leads_after_the_ttl(mem: MemoryHarness) -> None:
    stalled, other = mem.connect(ttl=TTL), mem.connect(ttl=TTL)
    asynclock.testing.faults(stalled).stall_renewals()
    leader = Candidate(stalled.election("e", identity="stalled"), resign=False)
    await leader.leads()
    successor = Candidate(other.election("e", identity="next"))
    term = await successor.leads(within=scaled(5) + 2 * TTL)
    with pytest.raises(LockLost):
        await leader.task
    assert term.identity == "next"
    successor.go.set()
    await successor.task


async def test_a_waiting_candidate_that_is_cancelled_or_times_out_leaves_the_line(elect_harness: Harness) -> None:
    a, b = elect_harness.connect(ttl=TTL), elect_harness.connect(ttl=TTL)
    leader = Candidate(a.election("e", identity="a"))
    await leader.leads()
    with pytest.raises(LockTimeout):
        async with b.election("e").leadership(timeout=0.05):
            pass
    await in_line(a.election("e"), 0)
    waiting = Candidate(b.election("e", identity="b"))
    await in_line(a.election("e"), 1)
    waiting.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting.task
    await in_line(a.election("e"), 0)  # (the candidate's key or entry goes by a clean-up after the cancellation)
    leader.go.set()
    await leader.task
    assert await a.election("e").leader() is None


async def test_an_abandoned_term_gives_leadership_up_at_once(
    elect_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that entered leadership and ended without leaving it abandons the term:
    released at once (not after the ttl), and the next candidate leads."""
    a, b = elect_harness.connect(ttl=30), elect_harness.connect(ttl=30)
    election = a.election("e", identity="gone")

    async def enter_and_vanish() -> None:
        await election.leadership().__aenter__()

    await asyncio.create_task(enter_and_vanish())
    waiting = Candidate(b.election("e", identity="b"))
    term = await waiting.leads(within=PROMPT)
    assert term.identity == "b"
    assert "abandoned" in caplog.text
    waiting.go.set()
    await waiting.task


async def test_leader_and_observe_need_no_candidacy(elect_harness: Harness) -> None:
    a, watcher = elect_harness.connect(ttl=TTL), elect_harness.connect(ttl=TTL)
    election = watcher.election("e")
    assert await election.leader() is None
    changes = election.observe()
    assert await anext(changes) is None
    leader = Candidate(a.election("e", identity="a"))
    term = await leader.leads()
    seen = await asyncio.wait_for(anext(changes), scaled(5))
    assert seen == await election.leader()
    assert seen is not None and (seen.identity, seen.token) == ("a", term.token)
    if elect_harness.kind in ("memory", "postgres", "mysql"):
        assert seen.since is not None and abs(seen.since - term.since) < 1.0
    else:
        assert seen.since is None  # (the server keeps no record of when a term began)
    leader.go.set()
    assert await asyncio.wait_for(anext(changes), scaled(5)) is None
    await leader.task
    await changes.aclose()  # type: ignore[attr-defined]


async def test_observe_sees_a_leader_lost_without_resigning(elect_harness: Harness) -> None:
    """A leader whose hold goes without a resign (memory://: its renewals stop and it expires;
    a server: the hold is taken away there) is seen gone, with no other candidate."""
    a, watcher = elect_harness.connect(ttl=TTL), elect_harness.connect(ttl=TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    leader = Candidate(a.election("e", identity="a"), resign=False)
    await leader.leads()
    assert (await asyncio.wait_for(anext(changes), scaled(5))).identity == "a"  # type: ignore[union-attr]
    if elect_harness.kind == "memory":
        asynclock.testing.faults(a).stall_renewals()
    else:
        assert await elect_harness.expire_shape("election", "e")
    assert await asyncio.wait_for(anext(changes), scaled(5) + 2 * TTL) is None
    with pytest.raises(LockLost):
        await leader.task
    await changes.aclose()  # type: ignore[attr-defined]


#: how a leader hands over in the test below: by resign(), or by closing its client with a drain
#: while its body runs (the body ends by itself once told, or the drain runs out and cancels it)
HAND_OVERS = ["resign", "aclose-body-ends", "aclose-drain-runs-out"]


@pytest.mark.parametrize("how", HAND_OVERS)
@pytest.mark.parametrize("elect_harness", [*ELECTING, "zookeeper"], indirect=True)
async def test_observe_sees_a_graceful_hand_over_as_one_change(elect_harness: Harness, how: str) -> None:
    """With B in line already, A hands over: an observer that is reading all along sees A,
    then B, and never a "nobody leads" in between (the server hands the lead over in the
    operation that ends A's term, or tells observers that it does)."""
    ttl = scaled(10)  # (nothing may wait for an expiry here)
    watcher, a, b = (elect_harness.connect(ttl=ttl) for _ in range(3))
    seen: list[asynclock.Leader | None] = []
    changed = asyncio.Event()

    async def follow() -> None:
        async for leader in watcher.election("e").observe():
            seen.append(leader)
            changed.set()

    async def next_seen(count: int) -> None:
        async with asyncio.timeout(scaled(5)):
            while len(seen) < count:
                changed.clear()
                await changed.wait()

    follower = asyncio.create_task(follow())
    await next_seen(1)
    first = Candidate(a.election("e", identity="a"), resign=how == "resign")
    term_a = await first.leads()
    await next_seen(2)
    second = Candidate(b.election("e", identity="b"))
    await in_line(watcher.election("e"), 1)
    if how == "resign":
        first.go.set()
    elif how == "aclose-body-ends":
        first.go.set()  # (a service's stop signal: its body ends while the drain waits for it)
        await a.aclose(drain=scaled(5))
    else:
        await a.aclose(drain=0.05)
    term_b = await second.leads(within=PROMPT)
    await next_seen(3)
    await asyncio.sleep(scaled(0.1))  # (a change seen late would be seen by now)
    assert [None if leader is None else (leader.identity, leader.token) for leader in seen] == [
        None,
        ("a", term_a.token),
        ("b", term_b.token),
    ], "A's hand-over to B was seen as one change"
    if how == "aclose-drain-runs-out":
        with pytest.raises(LockLost) as lost:
            await first.task
        assert lost.value.loss is asynclock.LossReason.CLOSING
    else:
        await first.task
    second.go.set()
    await second.task
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower


async def test_observe_ends_when_the_client_is_closed(elect_harness: Harness) -> None:
    watcher = elect_harness.connect(ttl=TTL)
    seen: list[asynclock.Leader | None] = []
    first = asyncio.Event()

    async def follow() -> str:
        async for leader in watcher.election("e").observe():
            seen.append(leader)
            first.set()
        return "ended"

    task = asyncio.create_task(follow())
    await asyncio.wait_for(first.wait(), scaled(5))
    await watcher.aclose()
    assert await asyncio.wait_for(task, scaled(5)) == "ended"
    assert seen == [None]


async def test_the_same_task_entering_again_re_enters_its_term(elect_harness: Harness) -> None:
    locks = elect_harness.connect(ttl=TTL)
    election = locks.election("e", identity="x")
    async with election.leadership() as outer:
        async with election.leadership() as inner:
            assert inner is outer
        assert election.leading and not outer.lost
    assert not election.leading
    assert await election.leader() is None


async def test_identity_defaults_to_host_pid_task_and_is_checked(mem: MemoryHarness) -> None:
    locks = mem.connect(ttl=TTL)

    async def lead() -> str:
        async with locks.election("e").leadership() as term:
            return term.identity

    task = asyncio.create_task(lead(), name="scheduler-loop")
    assert await task == f"{socket.gethostname()}:{os.getpid()}:scheduler-loop"
    with pytest.raises(ValueError, match="empty"):
        locks.election("e", identity="")
    with pytest.raises(TypeError):
        locks.election("e", identity=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1024"):
        locks.election("e", identity="x" * 1025)


async def test_an_election_is_not_the_lock_of_the_same_name(elect_harness: Harness) -> None:
    locks = elect_harness.connect(ttl=TTL)
    election = locks.election("shared", identity="x")
    assert election.key != locks.lock("shared").key
    async with election.leadership(), locks.lock("shared"):
        pass


async def test_inspect_shows_the_leaders_identity(elect_harness: Harness) -> None:
    locks = elect_harness.connect(ttl=TTL)
    election = locks.election("e", identity="replica-7 ✓")
    async with election.leadership() as term:
        (info,) = await collect(elect_harness.url, ["e"], prefix=elect_harness.prefix, kind="election")
    assert (info.owner, info.token, info.holders) == ("replica-7 ✓", term.token, ("replica-7 ✓",))
    assert info.key == election.key


#: the server backends these process tests run on (ZooKeeper's are in their own file)
SERVERS = [name for name in ELECTING if name != "memory"]


async def _lead_once(election: asynclock.Election) -> int | None:
    async with election.leadership() as term:
        return term.token


@pytest.mark.parametrize("elect_harness", SERVERS, indirect=True)
async def test_a_killed_leaders_process_is_seen_gone_and_replaced_after_its_ttl(elect_harness: Harness) -> None:
    """SIGKILL: no resign, no release. Observers see nobody lead once its hold expires, and
    the next candidate leads then, with a larger token (one leader at a time)."""
    watcher, locks = elect_harness.connect(ttl=TTL), elect_harness.connect(ttl=TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    async with children() as started:
        child = await ChildProcess.spawn(CANDIDATE, elect_harness.url, elect_harness.prefix, str(TTL), "child")
        started.append(child)
        words = (await child.line()).split()
        assert words[0] == "leading"
        seen = await asyncio.wait_for(anext(changes), scaled(5))
        assert seen is not None and (seen.identity, seen.token) == ("child", int(words[1]))
        loop = asyncio.get_running_loop()
        child.kill()
        await child.wait()
        killed = loop.time()
        assert await asyncio.wait_for(anext(changes), scaled(10)) is None, "a leader lost without resigning"
        # etcd counts a lease's TTL in whole seconds, rounded up: a dead client's hold lasts that long
        assert loop.time() - killed < scaled(5) + max(TTL, 1.0)
        token = await asyncio.wait_for(_lead_once(locks.election("e", identity="next")), scaled(10))
        assert token is not None and token > int(words[1])
    await changes.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("elect_harness", SERVERS, indirect=True)
async def test_a_frozen_leader_is_replaced_and_finds_its_term_lost_when_it_resumes(elect_harness: Harness) -> None:
    """SIGSTOP: the frozen leader cannot renew; the next candidate leads after its ttl, and
    the leader, resumed, finds its body cancelled (LockLost) instead of leading on."""
    locks = elect_harness.connect(ttl=TTL)
    async with children() as started:
        child = await ChildProcess.spawn(CANDIDATE, elect_harness.url, elect_harness.prefix, str(TTL), "frozen")
        started.append(child)
        words = (await child.line()).split()
        assert words[0] == "leading"
        child.proc.send_signal(signal.SIGSTOP)
        try:
            token = await asyncio.wait_for(_lead_once(locks.election("e", identity="next")), scaled(10))
        finally:
            child.proc.send_signal(signal.SIGCONT)
        assert token is not None and token > int(words[1])
        assert await child.line() == "lost", "the resumed leader's body was cancelled with LockLost"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "independent nodes keep neither"),
        ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "Redis Cluster (redis+cluster://)"),
    ],
)
async def test_a_backend_without_elections_refuses_before_any_io(url: str, why: str) -> None:
    """Port 1 answers nothing: a refusal there can only come from the front, before any I/O;
    it says why where the backend cannot have them."""
    locks = asynclock.connect(url)
    try:
        with pytest.raises(
            NotImplementedError, match=re.escape(f"the {locks.backend.scheme} backend does not provide leader")
        ) as refused:
            locks.election("e")
        assert why in str(refused.value)
    finally:
        await locks.aclose()
