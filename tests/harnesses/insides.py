"""The library's insides that tests look at or break, in one place.

Tests reach a client's state only through these functions, so that a change
inside the client is one change here, not one in every test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import asynclock
from asynclock.testing import conformance
from asynclock.testing.conformance._harness import stop_renewing

if TYPE_CHECKING:
    from asynclock._core import Core
    from asynclock._keeper import LeaseKeeper
    from asynclock._timing import Deadlines

__all__ = [
    "adopt",
    "armed_timer",
    "bounds_open",
    "clients_of",
    "core",
    "crash",
    "hold_of",
    "keeper",
    "notifies",
    "on_watchdog_wake",
    "pending_timers",
    "queued",
    "start",
    "stop_renewing",
    "watchdog_heap_size",
    "watchdog_task",
]


def core(locks: asynclock.Locks) -> Core:
    """The state the client shares with its handles."""
    return locks._core


def keeper(locks: asynclock.Locks) -> LeaseKeeper:
    """The client's watchdog (the client must have been used)."""
    found = locks._core.keeper
    assert found is not None, "the client has not been used yet"
    return found


async def start(locks: asynclock.Locks) -> None:
    """Connect the client and start its watchdog, as its first use would."""
    await locks._core.start()


async def crash(locks: asynclock.Locks) -> None:
    """Stop a client as a crash would: its watchdog and connections go, nothing is released."""
    inside = locks._core
    if inside.keeper is not None:
        await inside.keeper.aclose()
    background = list(inside._background)
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await locks.backend.aclose()
    inside.closed = True


def queued(locks: asynclock.Locks) -> list[asyncio.Task[object]]:
    """The tasks of this client waiting in a server's queue now."""
    return locks._core.waits()


def pending_timers(locks: asynclock.Locks) -> int:
    """How many of the client's timers (a singleton's end of ``at_least``) are due."""
    return locks._core.pending_timers()


def notifies(locks: asynclock.Locks) -> bool:
    """Whether the client's backend answers Busy and announces releases (rather than queueing waiters)."""
    return locks._core.notifies


def adopt(harness: conformance.Harness, *clients: asynclock.Locks) -> None:
    """Have the harness close these clients when it is left, as it closes those of its connect."""
    harness._clients.extend(clients)


def clients_of(harness: conformance.Harness) -> list[asynclock.Locks]:
    """The clients the harness closes when it is left (those of its connect, and those adopted)."""
    return harness._clients


def hold_of(lease: asynclock.Lease) -> str:
    """The hold id the lease was granted by the server (what a backend renews or releases)."""
    return lease._hold


def on_watchdog_wake(keeper: LeaseKeeper, hook: Callable[[], None]) -> None:
    """Call ``hook()`` each time the watchdog is woken by a change, just before it is woken."""
    wake = keeper._changed.set

    def woken() -> None:
        hook()
        wake()

    keeper._changed.set = woken  # type: ignore[method-assign]


def watchdog_heap_size(keeper: LeaseKeeper) -> int:
    """How many entries the watchdog's heap of due renewals holds, stale ones included."""
    return len(keeper._heap)


def watchdog_task(keeper: LeaseKeeper) -> asyncio.Task[None] | None:
    """The watchdog's running task (None once it is stopped)."""
    return keeper._task


def bounds_open(deadlines: Deadlines) -> int:
    """How many deadline blocks of ``deadlines`` are still registered."""
    return len(deadlines._bounds)


def armed_timer(deadlines: Deadlines) -> asyncio.TimerHandle | None:
    """The timer ``deadlines`` has armed for its earliest bound, if any."""
    return deadlines._timer
