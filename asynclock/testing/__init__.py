"""Testing code that uses asynclock: make "what happens when the lock is lost?" a short test.

* ``faults(locks)`` gives the fault controls of a ``memory://`` client: lose
  a lock now, stall its renewals, make it unavailable, slow every request
  down. They act exactly where a real backend's trouble acts (the
  watchdog's renewals, the requests), so the code under test sees what it
  would see in production: ``LockLost`` from its ``async with``, an
  ``"at_risk"`` event and ``lease.wait_at_risk()`` before a loss,
  ``BackendUnavailable`` from its acquires.
* ``virtual_clock()`` makes the running loop's time jump ahead whenever
  every task waits, so a 30 s ttl runs out in milliseconds (``memory://`` only).
* ``memory_client()`` is an isolated ``memory://`` client that fails on
  leaving if a lease is still held or an acquire still waiting; the pytest
  fixture ``locks`` (``from asynclock.testing import locks``, or the
  ``asynclock_fixtures`` ini option / ``--asynclock-fixtures`` flag of the
  pytest plugin) gives one to each test.
* :mod:`asynclock.testing.conformance` is the contract suite, for any backend.

Example::

    async with asynclock.connect("memory://", ttl=1) as locks:
        chaos = asynclock.testing.faults(locks)
        async with locks.lock("report") as lease:
            chaos.lose("report")          # the body is cancelled, LockLost is raised
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._options import seconds as checked
from .._validate import check_name
from ._clients import leaks, memory_client
from ._clock import VirtualClock, virtual_clock

if TYPE_CHECKING:
    from .._client import Locks
    from ..backends.memory import MemoryBackend

__all__ = ["Faults", "VirtualClock", "faults", "leaks", "memory_client", "virtual_clock"]


def faults(locks: Locks) -> Faults:
    """The fault controls of ``locks``, a ``memory://`` client (TypeError for another backend)."""
    from ..backends.memory import MemoryBackend

    backend = locks.backend
    if not isinstance(backend, MemoryBackend):
        raise TypeError(f"fault controls are for memory:// clients, not {backend.scheme}://")
    return Faults(backend)


class Faults:
    """What a test makes one ``memory://`` client suffer; made by :func:`faults`.

    Every control holds until :meth:`restore` (or the end of its ``with``
    block, for :meth:`unavailable`).
    """

    __slots__ = ("_backend",)

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend

    def lose(self, name: str) -> bool:
        """The lock ``name`` (every primitive of it) is lost now by whoever holds it.

        Its holders in this process are told at once: their ``async with``
        bodies are cancelled and raise ``LockLost`` (reason
        ``LossReason.TAKEN_OR_EXPIRED``), as when a server reports a hold gone.
        Returns whether it was held.
        """
        from ..backends.memory import lose_now

        return lose_now(check_name(name), prefix=self._backend._prefix)

    def stall_renewals(self, seconds: float | None = None) -> None:
        """Renewals of this client hang for ``seconds`` (None: until :meth:`restore`).

        The leases go *at risk* when a renewal has not answered in half the
        time left, and are lost at their trusted deadline if the stall lasts.
        """
        loop = asyncio.get_running_loop()
        self._backend.faults.stalled_until = math.inf if seconds is None else loop.time() + checked(seconds, "seconds")
        self._backend.faults_changed()

    def unavailable(self) -> _Unavailable:
        """Every request of this client raises ``BackendUnavailable``, until :meth:`restore`.

        Also a context manager: ``with faults.unavailable(): ...`` restores it on leaving.
        """
        self._backend.faults.unavailable = True
        self._backend.faults_changed()
        return _Unavailable(self)

    def delay(self, seconds: float) -> None:
        """Every request of this client takes ``seconds`` longer (0: no delay)."""
        self._backend.faults.delay = checked(seconds, "seconds", allow_zero=True)

    def restore(self) -> None:
        """No more faults: requests and renewals work again."""
        faults = self._backend.faults
        faults.unavailable = False
        faults.delay = 0.0
        faults.stalled_until = 0.0
        self._backend.faults_changed()


class _Unavailable:
    __slots__ = ("_faults",)

    def __init__(self, faults: Faults) -> None:
        self._faults = faults

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._faults._backend.faults.unavailable = False
        self._faults._backend.faults_changed()


def __getattr__(name: str) -> Any:
    # The pytest fixture is made on first use, so that this package imports without pytest.
    if name == "locks":
        from ._fixtures import locks

        return locks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
