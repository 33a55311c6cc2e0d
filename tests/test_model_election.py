"""A model of one election, checked against memory:// under sequences Hypothesis makes up.

Candidates join (each with its own client and identity), the leader resigns
or loses its term (``faults.lose``: no resign), waiting candidates leave the
line. After each step the election must match the model (who leads, how many
wait), and at the end two observers, one that read every change as it came
and one that read nothing until the end, must each have seen exactly the
model's sequence of leaders: every change, in order, none twice, with
strictly increasing tokens.
"""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asynclock
import asynclock.testing
from tests.harnesses import MemoryHarness
from tests.servers import scaled

TTL = scaled(0.15)
STEP = scaled(5)

operations = st.lists(
    st.one_of(
        st.just(("join", 0)),
        st.just(("resign", 0)),
        st.just(("lose", 0)),
        st.tuples(st.just("leave"), st.integers(0, 3)),
    ),
    max_size=12,
)


class Candidate:
    def __init__(self, locks: asynclock.Locks, identity: str) -> None:
        self.identity = identity
        self.election = locks.election("e", identity=identity)
        self.resign = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(asynclock.LockLost):
            async with self.election.leadership():
                await self.resign.wait()
                await self.election.resign()


async def settle(observer: asynclock.Election, leader: str | None, waiting: int) -> None:
    """Wait until the election shows the model's leader and line (a test's bounded look)."""
    async with asyncio.timeout(STEP):
        while True:
            now = await observer.leader()
            info = await observer.info()
            if (None if now is None else now.identity) == leader and info.waiters == waiting:
                return
            await asyncio.sleep(0.005)


async def check(ops: list[tuple[str, int]]) -> None:
    harness = MemoryHarness()
    async with harness:
        watcher = harness.connect(ttl=TTL)
        election = watcher.election("e")
        eager_seen: list[asynclock.Leader | None] = []

        async def follow() -> None:
            async for leader in election.observe():
                eager_seen.append(leader)

        eager = asyncio.create_task(follow())
        lazy = election.observe()
        assert await anext(lazy) is None  # (the lazy one starts watching here, then reads nothing)
        expected: list[str | None] = [None]
        leader: Candidate | None = None
        line: list[Candidate] = []
        joined = 0

        def becomes(state: Candidate | None) -> None:
            expected.append(None if state is None else state.identity)

        for op, arg in ops:
            if op == "join":
                candidate = Candidate(harness.connect(ttl=TTL), f"c{joined}")
                joined += 1
                if leader is None:
                    leader = candidate
                    becomes(leader)
                else:
                    line.append(candidate)
            elif op == "resign" and leader is not None:
                leader.resign.set()
                await leader.task
                leader = line.pop(0) if line else None
                becomes(leader)
            elif op == "lose" and leader is not None:
                asynclock.testing.faults(watcher).lose("e")
                await leader.task
                becomes(None)  # lost: nobody leads until the line is looked at again
                leader = line.pop(0) if line else None
                if leader is not None:
                    becomes(leader)
            elif op == "leave" and line:
                gone = line.pop(arg % len(line))
                gone.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await gone.task
            await settle(election, None if leader is None else leader.identity, len(line))

        # every candidate ends its term, in line order
        while leader is not None:
            leader.resign.set()
            await leader.task
            leader = line.pop(0) if line else None
            becomes(leader)
            await settle(election, None if leader is None else leader.identity, len(line))

        lazy_seen = [None]
        for _ in range(len(expected) - 1):
            lazy_seen.append(await asyncio.wait_for(anext(lazy), STEP))
        async with asyncio.timeout(STEP):
            while len(eager_seen) < len(expected):
                await asyncio.sleep(0.005)
        eager.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await eager
        await lazy.aclose()  # type: ignore[attr-defined]
        for seen in (eager_seen, lazy_seen):
            assert [None if s is None else s.identity for s in seen] == expected
            tokens = [s.token for s in seen if s is not None]
            assert all(t is not None for t in tokens)
            assert tokens == sorted(set(tokens)), f"tokens not strictly increasing: {tokens}"  # type: ignore[type-var]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_observe_sees_every_change_of_leader_in_order(ops: list[tuple[str, int]]) -> None:
    asyncio.run(asyncio.wait_for(check(ops), 60))
