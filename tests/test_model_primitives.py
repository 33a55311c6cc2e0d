"""A model of a read-write lock and a two-permit semaphore, checked step by
step against a real backend.

Hypothesis drives four owners (tasks) on two clients through try-once
acquires of ``read``, ``write`` and the semaphore, re-entry, read inside
write, refused upgrades, and releases by holders and non-holders. After every
step the server's view (``info().holders``), every owner's ``held`` and the
tokens must match the model: readers together or one writer, never more than
two permits, a new hold always with a higher token. It runs on every backend
that serves both primitives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import asynclock
from tests.conftest import make_harness
from tests.harnesses import Harness
from tests.servers import scaled
from tests.test_model import _Actor
from tests.test_primitives import FAIR_IS_PLAIN, SUPPORT

ACTORS = 4
PERMITS = 2
BACKENDS = [backend for backend in SUPPORT["rw"] if backend in SUPPORT["semaphore"]]


class PrimitivesModel(RuleBasedStateMachine):
    harness_factory: Callable[[], Harness]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.harness = self.loop.run_until_complete(self._make_harness())
        ttl = scaled(3.0)
        self.clients = [self.harness.connect(ttl=ttl) for _ in range(2)]
        self.actors = [self.loop.run_until_complete(self._spawn()) for _ in range(ACTORS)]
        self.client_of = [0, 0, 1, 1]
        # the model: owner -> hold count, per primitive; a read inside a write counts on the write
        self.readers: dict[int, int] = {}
        self.writer: tuple[int, int] | None = None  # (owner, count)
        self.joined: dict[int, int] = {}  # reads joined to the writer's hold
        self.permits: dict[int, int] = {}
        self.rw_tokens: list[int] = []
        self.sem_tokens: list[int] = []

    async def _make_harness(self) -> Harness:
        return type(self).harness_factory()

    async def _spawn(self) -> _Actor:
        return _Actor(asyncio.get_running_loop())

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, scaled(10)))

    def on(self, actor: int, func: Callable[[], Awaitable[Any]]) -> Any:
        async def send() -> Any:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            await self.actors[actor].queue.put((func, future))
            return await future

        return self.run(send())

    def rw(self, actor: int) -> asynclock.RWLock:
        return self.clients[self.client_of[actor]].rw_lock("rw")

    def sem(self, actor: int) -> asynclock.Semaphore:
        return self.clients[self.client_of[actor]].semaphore("sem", permits=PERMITS)

    def _new_token(self, tokens: list[int], lease: asynclock.Lease) -> None:
        if getattr(self.harness, "has_tokens", True):
            assert lease.token is not None
            assert not tokens or lease.token > tokens[-1], f"token went backwards: {lease.token} after {tokens}"
            tokens.append(lease.token)

    def _expect_timeout(self, actor: int, func: Callable[[], Awaitable[Any]], why: str) -> None:
        try:
            self.on(actor, func)
        except asynclock.LockTimeout:
            return
        raise AssertionError(why)

    @rule(actor=st.integers(0, ACTORS - 1))
    def read(self, actor: int) -> None:
        read = self.rw(actor).read
        if self.writer is not None and self.writer[0] == actor and actor not in self.readers:
            lease = self.on(actor, lambda: read.acquire(timeout=0))
            self.writer = (actor, self.writer[1] + 1)
            self.joined[actor] = self.joined.get(actor, 0) + 1
            assert lease.hold_count == self.writer[1]
        elif actor in self.readers:
            lease = self.on(actor, lambda: read.acquire(timeout=0))
            self.readers[actor] += 1
            assert lease.hold_count == self.readers[actor]
        elif self.writer is None:
            lease = self.on(actor, lambda: read.acquire(timeout=0))
            self._new_token(self.rw_tokens, lease)
            self.readers[actor] = 1
        else:
            self._expect_timeout(actor, lambda: read.acquire(timeout=0), "read while another task writes")

    @rule(actor=st.integers(0, ACTORS - 1))
    def write(self, actor: int) -> None:
        write = self.rw(actor).write
        if self.writer is not None and self.writer[0] == actor:
            lease = self.on(actor, lambda: write.acquire(timeout=0))
            self.writer = (actor, self.writer[1] + 1)
            assert lease.hold_count == self.writer[1]
        elif actor in self.readers:
            try:
                self.on(actor, lambda: write.acquire(timeout=0))
            except asynclock.LockError as exc:
                assert "upgrade" in str(exc)
            else:
                raise AssertionError("a reader upgraded to writer")
        elif self.writer is None and not self.readers:
            lease = self.on(actor, lambda: write.acquire(timeout=0))
            self._new_token(self.rw_tokens, lease)
            self.writer = (actor, 1)
        else:
            self._expect_timeout(actor, lambda: write.acquire(timeout=0), "write while others hold")

    @rule(actor=st.integers(0, ACTORS - 1))
    def release_read(self, actor: int) -> None:
        read = self.rw(actor).read
        if actor in self.readers:
            self.on(actor, read.release)
            self.readers[actor] -= 1
            if not self.readers[actor]:
                del self.readers[actor]
        elif self.joined.get(actor):
            assert self.writer is not None
            self.on(actor, read.release)
            self.joined[actor] -= 1
            if not self.joined[actor]:
                del self.joined[actor]
            count = self.writer[1] - 1
            self.writer = (actor, count) if count else None
        else:
            with pytest.raises(asynclock.NotHeld):
                self.on(actor, read.release)

    @rule(actor=st.integers(0, ACTORS - 1))
    def release_write(self, actor: int) -> None:
        write = self.rw(actor).write
        if self.writer is not None and self.writer[0] == actor and self.writer[1] > self.joined.get(actor, 0):
            self.on(actor, write.release)
            count = self.writer[1] - 1
            self.writer = (actor, count) if count else None
        else:
            # never acquired, or released as often as acquired with only joined reads left
            with pytest.raises(asynclock.NotHeld):
                self.on(actor, write.release)

    @rule(actor=st.integers(0, ACTORS - 1))
    def take_permit(self, actor: int) -> None:
        sem = self.sem(actor)
        if actor in self.permits:
            lease = self.on(actor, lambda: sem.acquire(timeout=0))
            self.permits[actor] += 1
            assert lease.hold_count == self.permits[actor]
        elif len(self.permits) < PERMITS:
            lease = self.on(actor, lambda: sem.acquire(timeout=0))
            self._new_token(self.sem_tokens, lease)
            self.permits[actor] = 1
        else:
            self._expect_timeout(actor, lambda: sem.acquire(timeout=0), f"a permit past {PERMITS}")

    @rule(actor=st.integers(0, ACTORS - 1))
    def give_permit(self, actor: int) -> None:
        sem = self.sem(actor)
        if actor in self.permits:
            self.on(actor, sem.release)
            self.permits[actor] -= 1
            if not self.permits[actor]:
                del self.permits[actor]
        else:
            with pytest.raises(asynclock.NotHeld):
                self.on(actor, sem.release)

    @invariant()
    def server_matches_model(self) -> None:
        read_info = self.run(self.rw(0).read.info())
        write_info = self.run(self.rw(0).write.info())
        sem_info = self.run(self.sem(0).info())
        holders = len(self.readers) + (1 if self.writer is not None else 0)
        # the two sides of one lock: each side's info lists the holders it knows
        rw_holders = set(read_info.holders) | set(write_info.holders)
        assert len(rw_holders) == holders, (rw_holders, self.readers, self.writer)
        assert len(set(sem_info.holders)) == len(self.permits), (sem_info, self.permits)
        for actor in range(ACTORS):
            rw, sem = self.rw(actor), self.sem(actor)
            reading, writing, permitted = self.on(actor, lambda rw=rw, sem=sem: _held(rw, sem))
            assert writing == (
                self.writer is not None and self.writer[0] == actor and self.writer[1] > self.joined.get(actor, 0)
            )
            assert reading == (actor in self.readers or bool(self.joined.get(actor)))
            assert permitted == (actor in self.permits)

    def teardown(self) -> None:
        async def close() -> None:
            for client in self.clients:
                await client.aclose()
            for actor in self.actors:
                actor.task.cancel()
            await asyncio.gather(*(actor.task for actor in self.actors), return_exceptions=True)
            try:
                left = await self.harness.leftovers()
                assert left == [], left
            finally:
                await self.harness.close()

        try:
            self.loop.run_until_complete(close())
        finally:
            self.loop.close()


async def _held(rw: asynclock.RWLock, sem: asynclock.Semaphore) -> tuple[bool, bool, bool]:
    return rw.read.held, rw.write.held, sem.held


MODEL_SETTINGS = settings(
    max_examples=12,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_of_rw_lock_and_semaphore(backend: str, request: pytest.FixtureRequest) -> None:
    # The servers are session fixtures; the harness is made inside the model's own loop.
    if backend != "memory":
        request.getfixturevalue({"redis": "redis_server"}.get(backend, f"{backend}_server"))

    class Model(PrimitivesModel):
        @staticmethod
        def harness_factory() -> Harness:
            return make_harness(request, backend)

    run_state_machine_as_test(Model, settings=MODEL_SETTINGS)


@pytest.mark.parametrize("backend", [backend for backend in SUPPORT["fair"] if backend not in FAIR_IS_PLAIN])
def test_model_of_the_fair_lock(backend: str, request: pytest.FixtureRequest) -> None:
    """The one-lock model of ``test_model.py`` (expiry, crashed clients, dropped
    connections included), on the fair lock where it is not the plain lock
    (which ``test_model.py`` runs on)."""
    from tests.test_model import MODEL_SETTINGS as LOCK_SETTINGS
    from tests.test_model import NAME, LockModel

    if backend != "memory":
        request.getfixturevalue({"redis": "redis_server"}.get(backend, f"{backend}_server"))

    class FairModel(LockModel):
        def make_harness(self) -> Harness:
            return make_harness(request, backend)

        async def expire_on_server(self) -> bool:
            return await self.harness.expire_shape("fair", NAME)

        def handle(self, client: asynclock.Locks) -> asynclock.Lock:
            return client.lock(NAME, fair=True)

    run_state_machine_as_test(FairModel, settings=LOCK_SETTINGS)
