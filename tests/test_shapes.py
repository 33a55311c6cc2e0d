"""The contract suite again, on the fair lock, the write side of a read-write
lock and a one-permit semaphore: with one holder at a time each of them is a
lock, and keeps every promise a lock makes on the server (exclusion, tokens,
re-entry, timeouts, renewal, loss → cancellation, cancel-safety, nothing left
behind). What the client does by itself is the same for every primitive and
runs once per backend, in tests/test_contract.py.

The harness below wraps a backend's harness so that ``locks.lock(name)`` in
the contract tests makes the primitive under test instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import asynclock
from asynclock.testing.conformance import ServerContract
from tests.conftest import make_harness
from tests.harnesses import Harness

pytestmark = pytest.mark.anyio

#: The backends that serve each primitive (the contract runs on each pair).
SHAPES: dict[str, list[str]] = {
    # Only memory://: elsewhere the fair lock is the plain lock on the server
    # (one key, one hold), which tests/test_contract.py runs on already.
    "fair": ["memory"],
    "write": ["memory", "redis", "zookeeper", "postgres", "etcd"],
    "semaphore": ["memory", "redis", "zookeeper", "postgres", "etcd", "mysql"],
}
PAIRS = [f"{backend}/{shape}" for shape, backends in SHAPES.items() for backend in backends]


def make(locks: asynclock.Locks, shape: str, name: str, ttl: float | None) -> asynclock.Lock:
    """The handle of ``shape`` on ``name`` that stands in for ``locks.lock(name)``."""
    if shape == "fair":
        return asynclock.Locks.lock(locks, name, ttl=ttl, fair=True)
    if shape == "write":
        return locks.rw_lock(name, ttl=ttl).write
    if shape == "semaphore":
        return locks.semaphore(name, permits=1, ttl=ttl)
    raise AssertionError(shape)


class ShapedHarness(Harness):
    """A backend's harness whose clients hand out ``shape`` handles from ``lock()``."""

    def __init__(self, inner: Harness, shape: str) -> None:
        self.inner = inner
        self.shape = shape
        self.kind = f"{inner.kind}/{shape}"
        self.can_pause = inner.can_pause
        self.server_counts = inner.server_counts
        self.prefix = inner.prefix
        self._clients = []
        if hasattr(inner, "has_tokens"):
            self.has_tokens = inner.has_tokens

    @property
    def url(self) -> str:
        return self.inner.url

    def connect(self, **options: Any) -> asynclock.Locks:
        locks = self.inner.connect(**options)
        shape = self.shape

        def lock(name: str, *, ttl: float | None = None) -> asynclock.Lock:
            return make(locks, shape, name, ttl)

        locks.lock = lock  # type: ignore[method-assign,assignment]
        return locks

    async def expire(self, name: str) -> bool:
        return await self.inner.expire_shape(self.shape, name)

    async def leftovers(self) -> list[str]:
        return await self.inner.leftovers()

    async def __aexit__(self, *exc: Any) -> None:
        pass  # the inner harness checks and closes


@pytest.fixture(params=PAIRS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    backend, shape = request.param.split("/")
    async with make_harness(request, backend) as inner:
        yield ShapedHarness(inner, shape)


class TestContract(ServerContract):
    """The conformance suite, on each (backend, primitive) pair of ``PAIRS``."""
