"""The library's insides that tests look at or break, in one place.

Tests reach a client's state only through these functions, so that a change
inside the client is one change here, not one in every test.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import asynclock
from asynclock.testing.conformance._harness import stop_renewing

if TYPE_CHECKING:
    from asynclock._core import Core
    from asynclock._keeper import LeaseKeeper

__all__ = ["core", "crash", "keeper", "notifies", "pending_timers", "queued", "start", "stop_renewing"]


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
