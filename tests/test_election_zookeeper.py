"""Leader election on ZooKeeper, against a real server: Curator's LeaderLatch layout
(and Curator itself electing with us), a leader's process killed or frozen, a
partitioned leader, and candidates that leave no node behind.

One leader at a time is checked where it can be seen: each new leader starts
after the old one's term ended (its process died, or its body was cancelled),
with a larger token.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

import asynclock
from asynclock import LockLost, LockTimeout
from asynclock.backends.zookeeper._order import contenders_of
from tests.child import CANDIDATE, ChildProcess, children
from tests.harnesses.zookeeper import CuratorProgram, ZooKeeperHarness, curator_program
from tests.servers import scaled
from tests.servers.proxy import TcpProxy
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)
#: a bound far below a long ttl: what passes within it did not wait for a session to expire
PROMPT = scaled(1.0)


@pytest.fixture
async def zk(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zookeeper_server)
    async with harness:
        yield harness


async def contenders(zk: ZooKeeperHarness, election: asynclock.Election) -> list[str]:
    return contenders_of(await (await zk.admin()).children(election.key))


async def leading(election: asynclock.Election, identity: str, within: float) -> asynclock.Leader:
    """Wait (a test's bounded look) until ``leader()`` says ``identity`` leads."""
    async with asyncio.timeout(within):
        while True:
            leader = await election.leader()
            if leader is not None and leader.identity == identity:
                return leader
            await asyncio.sleep(0.02)


async def test_a_candidate_is_a_curator_latch_node_holding_its_identity(zk: ZooKeeperHarness) -> None:
    locks, other = zk.connect(ttl=TTL), zk.connect(ttl=TTL)
    election = locks.election("scheduler", identity="replica-7 ✓")
    assert election.key == f"{zk.base}/%election/scheduler"
    async with election.leadership() as term:
        (node,) = await contenders(zk, election)
        assert re.fullmatch(r"_c_[0-9a-f-]{36}-latch-\d{10}", node), node
        admin = await zk.admin()
        assert await admin.data(f"{election.key}/{node}") == "replica-7 ✓".encode()
        stat = await admin.stat(f"{election.key}/{node}")
        assert term.token == int(stat.created_zxid)
        seen = await other.election("scheduler").leader()
        assert seen == asynclock.Leader("replica-7 ✓", term.token, None)
        info = await other.election("scheduler").info()
        assert (info.owner, info.token, info.waiters) == ("replica-7 ✓", term.token, 0)
        # a lock of the same name is another znode, and elections are not listed as locks
        async with other.lock("scheduler"):
            assert await other.backend.names() == ["scheduler"]
    assert await contenders(zk, election) == []
    assert await other.election("scheduler").leader() is None


async def test_resign_hands_over_within_one_hand_over_and_tokens_increase(zk: ZooKeeperHarness) -> None:
    """A 10 s session: the next candidate must lead long before any session could expire."""
    a, b = zk.connect(ttl=scaled(10)), zk.connect(ttl=scaled(10))
    started = asyncio.Event()
    terms: list[asynclock.Term] = []

    async def follow() -> None:
        async with b.election("e", identity="b").leadership() as term:
            terms.append(term)
            started.set()

    election = a.election("e", identity="a")
    async with election.leadership() as first:
        waiting = asyncio.create_task(follow())
        while len(await contenders(zk, election)) < 2:
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        resigned = loop.time()
        await election.resign()
    async with asyncio.timeout(PROMPT):
        await started.wait()
    assert loop.time() - resigned < PROMPT
    await waiting
    assert first.token is not None and terms[0].token is not None and terms[0].token > first.token


async def test_observe_starts_before_the_election_exists_and_sees_every_leader(zk: ZooKeeperHarness) -> None:
    """No election znode yet: the observer watches for its creation (an exists watch the
    server sets on a NoNode answer), then the first leader, the next, and nobody."""
    a, b, watcher = zk.connect(ttl=TTL), zk.connect(ttl=TTL), zk.connect(ttl=TTL)
    changes = watcher.election("fresh").observe()
    assert await anext(changes) is None
    first = a.election("fresh", identity="a")
    async with first.leadership():
        seen = await asyncio.wait_for(anext(changes), PROMPT)
        assert seen is not None and seen.identity == "a"
        second = b.election("fresh", identity="b")
        taking = asyncio.create_task(_lead_and_wait(second))
        while len(await contenders(zk, first)) < 2:
            await asyncio.sleep(0.01)
        await first.resign()
    seen = await asyncio.wait_for(anext(changes), PROMPT)
    assert seen is not None and seen.identity == "b"
    await second.resign()
    assert await taking is True
    assert await asyncio.wait_for(anext(changes), PROMPT) is None
    await changes.aclose()  # type: ignore[attr-defined]


async def _lead_once(election: asynclock.Election) -> int | None:
    async with election.leadership() as term:
        return term.token


async def test_cancelled_and_abandoned_candidates_leave_no_node(zk: ZooKeeperHarness) -> None:
    a, b = zk.connect(ttl=scaled(10)), zk.connect(ttl=scaled(10))
    election = a.election("e", identity="a")
    async with election.leadership():
        with pytest.raises(LockTimeout):
            async with b.election("e").leadership(timeout=0.05):
                pass
        waiting = asyncio.create_task(_lead_once(b.election("e", identity="b")))
        while len(await contenders(zk, election)) < 2:
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(await contenders(zk, election)) == 1

    async def enter_and_vanish() -> None:
        await b.election("e", identity="gone").leadership().__aenter__()

    await asyncio.create_task(enter_and_vanish())
    async with asyncio.timeout(PROMPT):  # abandoned: deleted at once, not at the session's end
        while await contenders(zk, election):
            await asyncio.sleep(0.01)


async def test_a_killed_leaders_process_loses_after_its_session_and_observers_see_it(zk: ZooKeeperHarness) -> None:
    watcher, locks = zk.connect(ttl=TTL), zk.connect(ttl=TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    async with children() as started:
        child = await ChildProcess.spawn(CANDIDATE, zk.url, zk.prefix, str(TTL), "child")
        started.append(child)
        words = (await child.line()).split()
        assert words[0] == "leading"
        seen = await asyncio.wait_for(anext(changes), PROMPT)
        assert seen is not None and (seen.identity, seen.token) == ("child", int(words[1]))
        successor = asyncio.create_task(_lead_once(locks.election("e", identity="next")))
        await asyncio.sleep(0.1)
        assert not successor.done()
        child.kill()
        await child.wait()
        # (the node goes when the server expires the dead client's session)
        gone = await asyncio.wait_for(anext(changes), scaled(10))
        token = await asyncio.wait_for(successor, scaled(10))
        assert token is not None and token > int(words[1])
        if gone is not None:  # the observer may see the successor directly (one watch event)
            assert gone.identity == "next"
    await changes.aclose()  # type: ignore[attr-defined]


async def test_a_frozen_leader_is_replaced_and_finds_its_term_lost_when_it_resumes(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    async with children() as started:
        child = await ChildProcess.spawn(CANDIDATE, zk.url, zk.prefix, str(TTL), "frozen")
        started.append(child)
        words = (await child.line()).split()
        assert words[0] == "leading"
        child.proc.send_signal(__import__("signal").SIGSTOP)
        try:
            token = await asyncio.wait_for(_lead_once(locks.election("e", identity="next")), scaled(10))
        finally:
            child.proc.send_signal(__import__("signal").SIGCONT)
        assert token is not None and token > int(words[1])
        assert await child.line() == "lost", "the resumed leader's body was cancelled with LockLost"


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", zookeeper_server.port) as tcp:
        yield tcp


async def test_a_partitioned_leader_stops_before_the_next_one_starts(zk: ZooKeeperHarness, proxy: TcpProxy) -> None:
    leader_client = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=TTL, prefix=zk.prefix)
    other = zk.connect(ttl=TTL)
    loop = asyncio.get_running_loop()
    stopped_at: list[float] = []
    entered = asyncio.Event()

    async def lead() -> None:
        try:
            async with leader_client.election("e", identity="cut").leadership():
                entered.set()
                await asyncio.sleep(3600)
        except LockLost:
            stopped_at.append(loop.time())
            raise

    async with leader_client:
        task = asyncio.create_task(lead())
        await entered.wait()
        proxy.blackhole()  # its session expires on the server: its node goes
        try:
            async with asyncio.timeout(scaled(20)), other.election("e", identity="next").leadership() as term:
                started_at = loop.time()
                assert term.identity == "next"
        finally:
            proxy.heal()
        with pytest.raises(LockLost):
            await task
    assert stopped_at and stopped_at[0] < started_at, "the partitioned leader's body ended before the next began"


# -- Curator ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curator_latch(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Compile the LeaderLatch program; the command that runs it (minus its arguments)."""
    jars = [
        next(iter(sorted(glob.glob(f"/usr/share/java/{name}.jar"))), None)
        for name in ("curator-recipes", "curator-framework", "curator-client", "slf4j-nop")
    ]
    javac, java = shutil.which("javac"), shutil.which("java")
    if None in jars[:3] or javac is None or java is None:
        pytest.skip("Curator (libcurator-recipes-java) or a JDK is missing: tests/run.sh installs them")
    classpath = os.pathsep.join(jar for jar in jars if jar)
    out = tmp_path_factory.mktemp("curator-latch")
    source = Path(__file__).parent / "servers" / "curator" / "CuratorLatch.java"
    subprocess.run([javac, "-cp", classpath, "-d", str(out), str(source)], check=True, timeout=120)
    return [java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", os.pathsep.join([str(out), classpath]), "CuratorLatch"]


class Latch(CuratorProgram):
    """One Curator LeaderLatch process."""

    async def expect(self, prefix: str, timeout: float | None = None) -> str:
        """The first line that starts with ``prefix``."""
        return await self.expect_line(lambda line: line.startswith(prefix), repr(prefix), timeout)

    async def who(self) -> str:
        await self.send("who")
        return (await self.expect("leader-is ")).removeprefix("leader-is ")

    async def close(self) -> None:
        await self.send("go")
        await self.expect("closed")
        await asyncio.wait_for(self.proc.wait(), scaled(10))


def latch(command: list[str], zk: ZooKeeperHarness, path: str, identity: str) -> AbstractAsyncContextManager[Latch]:
    return curator_program(Latch, command, zk, path, identity)


async def test_a_curator_leader_latch_and_our_candidates_elect_one_leader(
    zk: ZooKeeperHarness, curator_latch: list[str]
) -> None:
    locks = zk.connect(ttl=scaled(2))
    election = locks.election("interop", identity="ours")
    async with latch(curator_latch, zk, election.key, "curator-1") as curator:
        await curator.expect("leader")
        with pytest.raises(LockTimeout):
            async with election.leadership(timeout=SHORT):
                pass
        seen = await election.leader()
        (node,) = await contenders(zk, election)
        stat = await (await zk.admin()).stat(f"{election.key}/{node}")
        assert seen == asynclock.Leader("curator-1", int(stat.created_zxid), None)
        ours = asyncio.create_task(_lead_and_wait(election))
        while len(await contenders(zk, election)) < 2:
            await asyncio.sleep(0.01)
        assert not ours.done()
        await curator.close()  # Curator's leader goes: ours leads
        await leading(election, "ours", PROMPT)
    # and a Curator latch waits behind our leader, sees it as the leader, and leads after our resign
    async with latch(curator_latch, zk, election.key, "curator-2") as curator:
        while len(await contenders(zk, election)) < 2:
            await asyncio.sleep(0.01)
        assert await curator.who() == "ours"
        await election.resign()
        await curator.expect("leader", timeout=PROMPT)
        assert (await election.leader()).identity == "curator-2"  # type: ignore[union-attr]
        await curator.close()
    assert await ours is True
    assert await contenders(zk, election) == []


async def _lead_and_wait(election: asynclock.Election) -> bool:
    async with election.leadership():
        await asyncio.sleep(3600)
    return True  # (reached after a resign: the block ends without an exception)
