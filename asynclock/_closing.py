"""Closing a client: at once, after a drain, or when its event loop shuts down.

``aclose()`` releases every hold at once: the bodies under them are
cancelled first (they raise :class:`LockLost`), and acquires still waiting
end with ``BackendUnavailable``. ``aclose(drain=S)`` first stops taking new
work (new acquires and queued waits end with ``RuntimeError("client is
closing")``) and lets the bodies already running finish for up to ``S``
seconds, with the releases of those that end (a lock goes to its next
waiter before the connections close); the ones still running then are
cancelled (``LockLost`` with ``reason="closing"``). Either way every hold
is then released by its identity, so each lock goes to its next waiter (and
a leader's candidacy to the next candidate) within a round trip.

A client that is never closed is closed when its loop shuts down
(``asyncio.run`` returning or raising): the core registers an async
generator that the loop finalizes then. By that time the loop has cancelled
every task, releases spawned in the background among them, so those are
done again here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ._core import Core
from ._keeper import LeaseKeeper
from ._lease import Lease
from ._owner import current_owner
from ._release import release_by_identity
from ._timing import REQUEST_WINDOW
from ._values import LossReason

__all__ = ["close"]

logger = logging.getLogger("asynclock")

#: ``LockLost.reason`` of a body cancelled because its client's drain ran out.
DRAIN_ENDED = "closing"


async def close(core: Core, drain: float | None, at_loop_end: bool) -> None:
    """Close ``core``'s client; with ``drain``, let running bodies finish for up to that many seconds first.

    ``at_loop_end``: the loop is shutting down with the client still open (what it releases is logged).
    """
    if core.closed:
        return
    if drain is not None and not core.closing:
        await _drain(core, drain)
        if core.closed:
            return  # closed by another call meanwhile
    core.closed = True
    if core.loop_end is not None:
        # Closed before its loop ends: the loop has nothing left to do for it.
        hook, core.loop_end = core.loop_end, None
        await hook.aclose()
    for timer in core._timers:
        timer.cancel()  # what they were due to release is released below
    core._timers.clear()
    if core.hub is not None:
        core.hub.wake_all()  # waiting acquires of other tasks see the client closed
    waiting = _end_waits(core)
    if core.keeper is not None:
        released, left = await _release_all(core, core.keeper)
        if at_loop_end and (released or left):
            logger.warning(
                "asynclock: the event loop ended with a client still open: released %s%s"
                " (close the client, or leave its 'async with', to release them where you choose)",
                ", ".join(sorted({repr(name) for name in released})) or "nothing",
                f"; could not release {', '.join(sorted({repr(name) for name in left}))}, which expire by themselves"
                if left
                else "",
            )
    if waiting and core._waits:
        # Let the cancelled waits leave their queues (they start their clean-ups) first.
        core._waits_ended = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2 * REQUEST_WINDOW):
                await core._waits_ended.wait()
    if core._background:
        _, pending = await asyncio.wait(list(core._background), timeout=2 * REQUEST_WINDOW)
        for task in pending:
            task.cancel()
    if core._loop is not None:
        await core.backend.aclose()


def _end_waits(core: Core) -> int:
    """Cancel every acquire waiting in a server's queue; the acquire turns it into the closed (or closing) error."""
    waiting = list(core._waits.values())
    for wait in waiting:
        wait.closed = True
        wait.task.cancel()
    return len(waiting)


async def _drain(core: Core, drain: float) -> None:
    """Refuse new work, then wait up to ``drain`` seconds for the bodies under this client's leases to end."""
    core.closing = True
    if core.hub is not None:
        core.hub.wake_all()
    _end_waits(core)
    keeper = core.keeper
    if keeper is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + drain
    me = current_owner()
    while not core.closed:
        # (the closing task's own bodies cannot end while it waits here: they are not waited for)
        running = [lease for lease in keeper.holds() if lease._bodies() and lease.owner != me]
        left = deadline - loop.time()
        # (a body that ended has its release under way: it hands the lock over before the connections close)
        if not (running or core.releasing) or left <= 0:
            break
        core.body_left = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await core.body_left.wait()
    core.body_left = None
    for lease in keeper.holds():
        if lease._bodies():
            lease._close(DRAIN_ENDED, spare_owner=me, loss=LossReason.CLOSING)


async def _release_all(core: Core, keeper: LeaseKeeper) -> tuple[list[str], list[str]]:
    """Release every hold (bounded); the names of those released, and of those left to expire."""
    leases = keeper.holds()
    me = current_owner()
    now = asyncio.get_running_loop().time()
    for lease in leases:
        keeper.remove(lease)
        core.forget(lease)
    # A singleton job's lock stays held until its at_least has passed: its last
    # renewal made the server's hold last that long (a session's ends with it).
    leases = [lease for lease in leases if not lease._kept_past(now)]
    for lease in leases:
        # Like a loss: every body under it is cancelled before the
        # release below lets anybody else in.
        lease._close("the client was closed while the lock was held", spare_owner=me)
    # Releases in the background that never ran (the loop's shutdown cancelled them).
    again: list[Lease] = [lease for lease, task in core.giving_back.items() if task.cancelled()]
    core.giving_back.clear()
    everything = leases + again
    released: list[bool | BaseException] = []
    if everything:
        # A courtesy to the next holder, bounded: a hold we cannot
        # release now expires by itself (nobody renews it any more).
        soon = asyncio.get_running_loop().time() + 2 * REQUEST_WINDOW
        released = await asyncio.gather(
            *(release_by_identity(core.backend, lease, raise_errors=False, give_up=soon) for lease in everything),
            return_exceptions=True,
        )
    await keeper.aclose()
    return [lease.name for lease, done in zip(everything, released, strict=True) if done is True], [
        lease.name for lease, done in zip(everything, released, strict=True) if done is not True
    ]
