"""What the suite needs from a backend (:class:`Harness`), its time scale, and the helpers its tests share."""

from __future__ import annotations

import os
import secrets
from types import TracebackType
from typing import Any

import asynclock

__all__ = ["SCALE", "TTL", "Harness", "free_now", "has_tokens", "scaled", "stop_renewing"]

#: Multiplies every ttl and time bound of the suite (``ASYNCLOCK_TEST_SCALE``).
SCALE = float(os.environ.get("ASYNCLOCK_TEST_SCALE", "1"))


def scaled(seconds: float) -> float:
    """``seconds`` times ``ASYNCLOCK_TEST_SCALE``."""
    return seconds * SCALE


#: The lease time of the suite's locks.
TTL = scaled(0.6)


async def stop_renewing(locks: asynclock.Locks) -> None:
    """Make ``locks`` a holder that died, as far as its server can tell: its
    watchdog stops, nothing is released, and nobody tells its leases."""
    keeper = locks._core.keeper
    assert keeper is not None, "the client has not been used yet"
    await keeper.aclose()


class Harness:
    """What the contract suite needs from a backend: made fresh for each test by
    a ``harness`` fixture, entered with ``async with`` (see :mod:`asynclock.testing.conformance`).

    Leaving it closes every client it made, fails the test if :meth:`leftovers`
    finds anything (unless the test failed already), then calls :meth:`close`.
    """

    #: Whether the backend gives fencing tokens (False: ``lease.token`` is always None).
    has_tokens: bool = True
    #: Whether the server keeps the hold count of a re-entered lock (``info().hold_count``).
    server_counts: bool = True

    def __init__(self, prefix: str | None = None) -> None:
        #: The key prefix of this test: every client :meth:`connect` makes uses it.
        self.prefix = prefix or f"t{secrets.token_hex(4)}"
        self._clients: list[asynclock.Locks] = []

    @property
    def url(self) -> str:
        """The URL the default :meth:`open` connects to."""
        raise NotImplementedError("give the harness a url, or override open()")

    def open(self, **options: Any) -> asynclock.Locks:
        """A new client of the backend under test with these ``connect`` options
        (``prefix`` always among them). Override it for a backend without a URL:
        ``asynclock.Locks(backend, ttl=..., on_event=...)`` takes a backend object."""
        return asynclock.connect(self.url, **options)

    def connect(self, **options: Any) -> asynclock.Locks:
        """A client of this test (``prefix`` defaults to :attr:`prefix`), closed when the harness is left."""
        options.setdefault("prefix", self.prefix)
        locks = self.open(**options)
        self._clients.append(locks)
        return locks

    async def expire(self, name: str) -> bool:
        """Remove the hold on the plain lock ``name`` on the server, as an expiry would
        (no notification to the client); whether there was one."""
        raise NotImplementedError

    async def leftovers(self) -> list[str]:
        """What this test's prefix still has on the server (keys, nodes, locks), fence counters aside."""
        raise NotImplementedError

    async def close(self) -> None:
        """Called last, whatever happened: drop what the test made on the server, close admin connections."""

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            for locks in self._clients:
                await locks.aclose()
            if exc_type is None:
                left = await self.leftovers()
                assert not left, f"test left locks behind: {left}"
        finally:
            await self.close()


def has_tokens(harness: Harness) -> bool:
    """Whether the backend gives fencing tokens (Redlock does not: its tokens are None)."""
    return bool(getattr(harness, "has_tokens", True))


async def free_now(locks: asynclock.Locks, name: str) -> None:
    """Take and give back ``name``, which must be free on the server (or become free
    within a hand-over), not only after a holder's ttl."""
    await locks.lock(name).acquire(timeout=TTL / 2)
    await locks.lock(name).release()
