"""Lease: what a holder gets. Its state underneath, and how that changes, is
:class:`~asynclock._holdstate.HoldState`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from ._holdstate import HoldState, now

if TYPE_CHECKING:
    pass

__all__ = ["Lease"]


class Lease(HoldState):
    """A hold on a lock, returned by ``acquire`` and ``async with``.

    ``token`` is the fencing token: pass it to the resource you protect so that
    a holder whose lease was lost cannot write after the next holder did.
    ``expires_at`` is the deadline this client trusts, by the event loop's clock;
    the watchdog keeps moving it forward while the lease is renewed.
    ``lost`` turns true when the lease is lost; ``await lease.wait_lost()``
    returns then. ``remaining`` is how many seconds are left until the trusted
    deadline; ``at_risk`` turns true (and ``await lease.wait_at_risk()``
    returns) when a renewal has failed but the lease is not lost yet: the
    moment to checkpoint before the body may be cancelled. Re-entering the
    lock returns the same Lease with a higher ``hold_count``.
    ``await lease.release()`` releases it (every hold) from any task, e.g. a
    request handler other than the one that acquired it.

    Example::

        lease = await lock.acquire()
        try:
            await write(data, fencing_token=lease.token)
        finally:
            await lock.release()
    """

    __slots__ = ()

    # (set by HoldState.__init__, whose slots they are: one constructor on the acquire's path)
    #: The lock's name.
    name: str
    #: The fencing token: strictly greater than every earlier holder's of this lock (None where the backend has none).
    token: int | None
    #: How many times the owner holds it (re-entries); a release at 1 gives it up.
    hold_count: int

    def __repr__(self) -> str:
        state = f"lost: {self._reason}" if self._reason else f"holds={self.hold_count}"
        return f"<Lease {self.name!r} token={self.token} {state}>"

    @property
    def expires_at(self) -> float:
        """The loop time (``asyncio.get_running_loop().time()``) until which this client trusts the lease."""
        return self._expires_at

    @property
    def remaining(self) -> float:
        """Seconds left until the trusted deadline (0 once the lease is lost or released)."""
        if not self._held:
            return 0.0
        return max(0.0, self._expires_at - now())

    @property
    def at_risk(self) -> bool:
        """True while a renewal has failed and none has succeeded since, and the lease is not lost yet."""
        return self._at_risk is not None and not self.lost

    @property
    def lost(self) -> bool:
        """True once the lease is lost (taken, expired, or not renewed in time)."""
        if self._reason is not None:
            return True
        if self._released:
            return False
        return now() >= self._expires_at

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, or None."""
        if self._reason is None and self.lost:
            return self._deadline_reason()
        return self._reason

    async def wait_lost(self) -> str:
        """Wait until the lease is lost and return the reason.

        Waits forever for a lease that is released without being lost.
        """
        if self._lost_event is None:
            self._lost_event = asyncio.Event()
            if self._reason is not None:
                self._lost_event.set()
        while self._reason is None:
            if self._released:
                await self._lost_event.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self._expires_at):
                    await self._lost_event.wait()
            self._check_deadline()
        return self._reason

    async def wait_at_risk(self) -> str:
        """Wait until a renewal of this lease fails (or the lease is lost) and return why.

        Returns at once if that is so already. The lease may still recover
        (the next renewal succeeds); ``at_risk`` says whether it has. Waits
        forever for a lease that is released without either.
        """
        while self._at_risk is None and self._reason is None:
            if self._risk_event is None:
                self._risk_event = asyncio.Event()
            if self._released:
                await self._risk_event.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self._expires_at):
                    await self._risk_event.wait()
            self._check_deadline()
        return self._at_risk or self._reason or "lost"

    async def release(self) -> None:
        """Release this lease, every hold of it, from any task.

        Raises :class:`NotHeld` if it was already released or lost. An
        ``async with`` body of another task that runs under this lease is
        cancelled and its block raises :class:`LockLost`.
        """
        await self._releaser(self)
