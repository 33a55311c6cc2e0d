"""The state of a hold as the client sees it, and its transitions: what a
:class:`~asynclock._lease.Lease` is underneath.

A hold is *held* until it is released (``_released``) or lost (``_reason``).
Its trusted deadline is the send time of the last request that proved it,
plus the lease time, minus a drift allowance: the server's own expiry is
always later, so the holder stops first. The keeper renews it (``_renewed``,
``_mark_at_risk``); losing it cancels every body that runs under it; the
client watches its owner task and its ``max_hold`` cap here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._timing import RETRY_FIRST, drift, request_window
from ._values import LossReason
from .abc import RenewItem

if TYPE_CHECKING:
    import anyio

    from .abc import LockRef

__all__ = ["HoldState", "now"]

H = TypeVar("H", bound="HoldState")


class HoldState:
    """A hold's state and transitions; the client, the keeper and the engine call these, never users."""

    __slots__ = (
        "_acquired_at",
        "_at_risk",
        "_backoff",
        "_cap",
        "_cohort",
        "_expires_at",
        "_hold",
        "_hold_until",
        "_key",
        "_last_error",
        "_lease_time",
        "_loss",
        "_lost_event",
        "_next_due",
        "_on_lost",
        "_owner_done",
        "_owner_task",
        "_reason",
        "_ref",
        "_released",
        "_releaser",
        "_renewal",
        "_risk_event",
        "_scopes",
        "_ttl",
        "_watchers",
        "hold_count",
        "name",
        "owner",
        "token",
    )

    def __init__(
        self,
        *,
        ref: LockRef,
        key: LockRef,
        hold: str,
        ttl: float,
        lease_time: float,
        sent_at: float,
        owner: str,
        on_lost: Callable[[Any, str, LossReason], None],
        releaser: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.name = ref.name
        self.owner = owner
        self.token: int | None = None
        self.hold_count = 1
        self._hold = hold
        self._ttl = ttl
        self._lease_time = lease_time
        self._expires_at = sent_at + lease_time - drift(ttl)
        self._next_due = sent_at + ttl / 3
        self._acquired_at = sent_at
        self._backoff = RETRY_FIRST
        self._reason: str | None = None
        self._loss: LossReason | None = None
        self._last_error: str | None = None
        self._released = False
        self._lost_event: asyncio.Event | None = None
        self._at_risk: str | None = None  # why, while a renewal has failed and none succeeded since
        self._risk_event: asyncio.Event | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._on_lost = on_lost
        self._releaser = releaser
        #: the request this lease was acquired with (renewals and release use it)
        self._ref = ref
        #: the lock it holds for re-entry: the plain lock's ref where that is this very lock on the server
        self._key = key
        # the keeper's cohort this lease is renewed with, and what it asks the backend
        self._cohort: Any = None
        self._renewal: RenewItem | None = None
        # loop time until which each renewal makes the server keep the hold, and no longer
        # (a singleton job's at_least: held then even if this process dies or closes the client)
        self._hold_until: float | None = None
        # The task that owns the hold, while it is watched for ending still holding it.
        self._owner_task: asyncio.Task[Any] | None = None
        self._owner_done: Callable[[asyncio.Task[Any]], None] | None = None
        # the loop timer that ends the hold at its handle's max_hold
        self._cap: asyncio.TimerHandle | None = None
        # told once when the hold ends, released or lost (a multi-lock whose part this is)
        self._watchers: list[Callable[[Any], None]] | None = None

    @property
    def _held(self) -> bool:
        return self._reason is None and not self._released

    def _deadline_reason(self) -> str:
        reason = "the trusted deadline passed without a renewal"
        if self._last_error is not None:
            reason += f" (last renewal error: {self._last_error})"
        elif self._at_risk is not None:
            reason += f" ({self._at_risk})"  # (a renewal that never answered: why it was at risk)
        return reason

    def _renewed(self, sent_at: float) -> None:
        self._expires_at = sent_at + self._lease_time - drift(self._ttl)
        self._next_due = sent_at + self._ttl / 3
        self._backoff = RETRY_FIRST
        self._last_error = None
        if self._at_risk is not None:
            self._at_risk = None
            if self._risk_event is not None:
                self._risk_event.clear()

    def _mark_at_risk(self, reason: str) -> bool:
        """A renewal failed: at risk, unless it is so already (True the first time of a streak)."""
        if self._at_risk is not None or not self._held:
            return False
        self._at_risk = reason
        if self._risk_event is not None:
            self._risk_event.set()
        return True

    def _renew_item(self) -> RenewItem:
        """What the keeper asks the backend to renew (made once, unless the hold must end at ``_hold_until``).

        Until ``_hold_until`` the server keeps the hold to that time plus a
        request window (the client releases it then, so that is never cut short).
        """
        if self._hold_until is not None:
            left = max(0.0, self._hold_until - now())
            return RenewItem(self._ref, self._hold, left + request_window(self._lease_time))
        item = self._renewal
        if item is None:
            item = self._renewal = RenewItem(self._ref, self._hold, self._ttl)
        return item

    def _check_deadline(self) -> bool:
        """Lose the lease if its trusted deadline has passed unnoticed; whether it is lost."""
        if self._held and now() >= self._expires_at:
            self._lose(self._deadline_reason(), LossReason.RENEWAL_FAILED)
        return self._reason is not None

    def _lose(self, reason: str, loss: LossReason) -> None:
        """Lost now: cancel every body under it and tell the client (once)."""
        if not self._held:
            return
        self._mark_lost(reason, loss)
        self._cancel_bodies()
        self._on_lost(self, reason, loss)

    def _close(self, reason: str, spare_owner: str | None, loss: LossReason = LossReason.CLIENT_CLOSED) -> None:
        """Lost because the client is closing: cancel the bodies under it, except
        ``spare_owner``'s (the task that closes the client, which would cut its own
        close short; it gets LockLost when it leaves its block). Nothing if it is lost already."""
        if self._reason is not None:
            return
        self._mark_lost(reason, loss)
        if self.owner != spare_owner:
            self._cancel_bodies()

    def _add_body(self, scope: anyio.CancelScope) -> None:
        """A body runs under this lease in ``scope``: a loss cancels it."""
        self._scopes.append(scope)

    def _remove_body(self, scope: anyio.CancelScope) -> None:
        self._scopes.remove(scope)

    def _bodies(self) -> list[anyio.CancelScope]:
        """The cancel scopes of the bodies that run under this lease now."""
        return self._scopes

    def _mark_released(self) -> None:
        """Released (or about to be, by a request already decided on): no longer held."""
        self._released = True
        if self._watchers is not None:
            self._ended()

    def _watch_end(self, watcher: Callable[[Any], None]) -> None:
        """Call ``watcher(self)`` once, when this hold ends (released or lost), unless :meth:`_unwatch_end` first."""
        if self._watchers is None:
            self._watchers = []
        self._watchers.append(watcher)

    def _unwatch_end(self, watcher: Callable[[Any], None]) -> None:
        if self._watchers is not None and watcher in self._watchers:
            self._watchers.remove(watcher)

    def _ended(self) -> None:
        watchers, self._watchers = self._watchers, None
        for watcher in watchers or ():
            watcher(self)

    def _release_refused(self, reason: str) -> None:
        """The server no longer had the hold when its release came: it was lost before, not released."""
        self._released = False
        self._lose(reason, LossReason.TAKEN_OR_EXPIRED)

    def _keep_until(self, until: float) -> None:
        """Each renewal makes the server keep the hold until the loop time ``until`` (and a window), no longer."""
        self._hold_until = until

    def _cap_at(self, when: float) -> None:
        """Lose the lease at the loop time ``when`` (its handle's ``max_hold``), unless it ends before."""
        if self._cap is None and self._held:
            self._cap = asyncio.get_running_loop().call_at(when, self._capped)

    def _capped(self) -> None:
        self._cap = None
        self._lose("max_hold", LossReason.MAX_HOLD)

    def _cancel_bodies(self) -> None:
        """Cancel every ``async with`` body that runs under this lease."""
        for scope in self._scopes:
            scope.cancel()

    def _held_for(self) -> float:
        """Seconds since the hold was acquired."""
        return now() - self._acquired_at

    def _kept_past(self, now: float) -> bool:
        """Whether the server keeps the hold beyond the loop time ``now`` on purpose (a singleton's ``at_least``)."""
        return self._hold_until is not None and self._hold_until > now

    def _watch_owner(self: H, task: asyncio.Task[Any], on_end: Callable[[H, asyncio.Task[Any]], None]) -> None:
        """Call ``on_end(self, task)`` if ``task``, the hold's owner, ends before :meth:`_detach`."""
        if self._owner_task is task:
            return
        self._owner_task = task
        self._owner_done = functools.partial(self._owner_ended, on_end)
        task.add_done_callback(self._owner_done)

    def _owner_ended(self: H, on_end: Callable[[H, asyncio.Task[Any]], None], task: asyncio.Task[Any]) -> None:
        self._owner_task = self._owner_done = None
        on_end(self, task)

    def _detach(self) -> None:
        """No longer held by this client: stop watching the owner task and the ``max_hold`` cap."""
        if self._cap is not None:
            self._cap.cancel()
            self._cap = None
        task, done = self._owner_task, self._owner_done
        if task is not None and done is not None:
            self._owner_task = self._owner_done = None
            task.remove_done_callback(done)

    def _mark_lost(self, reason: str, loss: LossReason) -> None:
        self._reason = reason
        self._loss = loss
        if self._lost_event is not None:
            self._lost_event.set()
        if self._risk_event is not None:
            self._risk_event.set()
        if self._watchers is not None:
            self._ended()


def now() -> float:
    """The running loop's time."""
    return asyncio.get_running_loop().time()
