"""The client's core: what the client, its handles and the acquisition engine share.

``Locks`` (the client) owns one ``Core`` and gives it to every handle it
makes and, through them, to the engine: the backend, the one watchdog
(``LeaseKeeper``) and the one notification hub (``WakeHub``), the request
timers, the background tasks, the events, and the table of holds and of
acquires waiting in a server's queue. What happens to a hold outside an
acquire (release, loss, abandonment by its owner task) is done here, once.

Nothing here imports a handle or the client: they import this.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

from ._errors import BackendUnavailable, NotHeld
from ._events import EventCallback, Events
from ._holds import Holds
from ._keeper import LeaseKeeper
from ._lease import Lease
from ._owner import current_owner
from ._release import release_by_identity
from ._timing import Deadlines
from ._validate import check_ttl
from ._values import LossReason
from ._wake import WakeHub
from .abc import Backend, BoundsTtl, Notifies

__all__ = ["CLIENT_CLOSED", "CLIENT_CLOSING", "CLOSED", "Core", "Wait"]

logger = logging.getLogger("asynclock")

#: What every call on a closed client raises.
CLIENT_CLOSED = "client is closed"
#: What a new acquire, or one waiting, raises while the client drains before it closes.
CLIENT_CLOSING = "client is closing"
#: Why an acquire in progress ends when its client is closed.
CLOSED = "the Locks client was closed while this acquire was in progress"


class Wait:
    """``with core.waiting():`` registers the current task as waiting in a server's queue (or on a watch).

    Closing the client cancels every registered task and sets ``closed``:
    the waiting code then turns its CancelledError into "the client was
    closed". Leaving the block deregisters the task, which is what the close
    waits for before it closes the backend.
    """

    __slots__ = ("_core", "closed", "task")

    def __init__(self, core: Core, task: asyncio.Task[Any]) -> None:
        self._core = core
        self.task = task
        self.closed = False

    def __enter__(self) -> Wait:
        self._core._waits[self.task] = self
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        core = self._core
        core._waits.pop(self.task, None)
        if not core._waits and core._waits_ended is not None:
            core._waits_ended.set()


class Core:
    """The state and services of one client (see the module docstring)."""

    __slots__ = (
        "_background",
        "_closer",
        "_hold_seq",
        "_loop",
        "_start_lock",
        "_timers",
        "_waits",
        "_waits_ended",
        "backend",
        "body_left",
        "closed",
        "closing",
        "deadlines",
        "events",
        "giving_back",
        "holds",
        "hub",
        "keeper",
        "loop_end",
        "notifies",
        "releasing",
        "ttl",
    )

    def __init__(
        self,
        backend: Backend,
        ttl: float,
        on_event: EventCallback | None,
        closer: Callable[[Core, float | None, bool], Awaitable[None]],
    ) -> None:
        self.backend = backend
        self._closer = closer
        self.notifies = isinstance(backend, Notifies)
        self.ttl = ttl
        self.events = Events(secrets.token_hex(8), on_event)
        self.holds = Holds()
        self.deadlines = Deadlines()
        self.keeper: LeaseKeeper | None = None
        self.hub: WakeHub | None = None
        self.closed = False
        # a drain is under way: new acquires and queued waits end with RuntimeError("client is closing")
        self.closing = False
        # set while a drain waits, when a body under a lease of this client ends or a release returns
        self.body_left: asyncio.Event | None = None
        # releases under way (``release``): a drain waits for them before the connections close
        self.releasing = 0
        # releases under way in the background (an abandoned or lost hold): a close at the
        # loop's end does again those that the loop's shutdown cancelled
        self.giving_back: dict[Lease, asyncio.Task[Any]] = {}
        # an async generator the loop finalizes when it shuts down: a client never closed closes then
        self.loop_end: AsyncGenerator[None, None] | None = None
        self._waits: dict[asyncio.Task[Any], Wait] = {}
        self._waits_ended: asyncio.Event | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # loop timers of what is due later (the end of a singleton job's at_least)
        self._timers: set[asyncio.TimerHandle] = set()
        self._hold_seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None

    @property
    def client_id(self) -> str:
        return self.events.client_id

    # -- checks, start and close ---------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError(CLIENT_CLOSED)

    def check_accepting(self) -> None:
        """Refuse a new hold once the client is closing or closed."""
        if self.closing:
            raise RuntimeError(CLIENT_CLOSING)
        self.check_open()

    def closed_error(self) -> Exception:
        """What an acquire that the close ended raises: the client is closing (a drain), or closed."""
        if self.closing:
            return RuntimeError(CLIENT_CLOSING)
        return BackendUnavailable(CLOSED)

    def check_ttl(self, ttl: float | None) -> float:
        """A handle's ttl: the client's when None; else checked, and refused (no I/O) if the backend cannot carry it."""
        if ttl is None:
            return self.ttl
        ttl = check_ttl(ttl)
        if isinstance(self.backend, BoundsTtl):
            self.backend.check_ttl(ttl)
        return ttl

    async def start(self) -> LeaseKeeper:
        """Start the backend, the hub and the watchdog on first use; the watchdog."""
        self.check_open()
        keeper = self.keeper
        if keeper is not None:
            if self._loop is not asyncio.get_running_loop():
                raise RuntimeError("a Locks client belongs to the event loop it was first used in")
            return keeper
        loop = asyncio.get_running_loop()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.keeper is None:
                self._loop = loop
                backend = self.backend
                hub = WakeHub(backend if isinstance(backend, Notifies) else None, self.spawn, self._lose, self._at_risk)
                await backend.start(hub)
                self.hub = hub
                on_renewed = self._renewed if self.events.callback is not None else None
                self.keeper = LeaseKeeper(backend, on_renewed, self._lease_at_risk)
                self.loop_end = self._at_loop_end()
                await anext(self.loop_end)  # the loop now finalizes it when it shuts down
            return self.keeper

    async def _at_loop_end(self) -> AsyncGenerator[None, None]:
        """Suspended for the client's life; the loop's shutdown (``asyncio.run`` ending) closes it,
        and a client not closed by then is closed here, while the loop still runs."""
        try:
            yield
        finally:
            self.loop_end = None
            if not self.closed:
                await self._closer(self, None, True)

    async def close(self, drain: float | None = None) -> None:
        """Close the client (see :func:`asynclock._closing.close`, which the client gave)."""
        await self._closer(self, drain, False)

    # -- tasks, timers and waits ---------------------------------------------------

    def new_hold(self, owner: str) -> str:
        """A hold id never used before: the client, the owner, and a sequence number."""
        return f"{self.events.client_id}:{owner}:{next(self._hold_seq)}"

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; the close waits for it (bounded), then cancels it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def give_back(self, lease: Lease, *, quiet: bool = False) -> None:
        """Release ``lease`` by its identity in the background (it is no longer held as far as this client
        goes); ``quiet``: a failure to is not news (the loss was said), and is logged at DEBUG only."""
        task = self.spawn(release_by_identity(self.backend, lease, raise_errors=False, quiet=quiet))
        self.giving_back[lease] = task
        task.add_done_callback(lambda done: self._given_back(lease, done))

    def _given_back(self, lease: Lease, task: asyncio.Task[Any]) -> None:
        if self.giving_back.get(lease) is task and not task.cancelled():
            del self.giving_back[lease]

    def later(self, when: float, callback: Callable[[], object]) -> None:
        """Call ``callback`` at the loop time ``when``, unless the client is closed first."""

        def fire() -> None:
            self._timers.discard(handle)
            callback()

        handle = asyncio.get_running_loop().call_at(when, fire)
        self._timers.add(handle)

    def waiting(self) -> Wait:
        """A :class:`Wait` for the current task, to enter around one wait in a server's queue."""
        task = asyncio.current_task()
        assert task is not None
        return Wait(self, task)

    def waits(self) -> list[asyncio.Task[Any]]:
        """The tasks waiting in a server's queue now."""
        return list(self._waits)

    def pending_timers(self) -> int:
        """How many timers (a singleton job's end of ``at_least``) are still due."""
        return len(self._timers)

    # -- the life of a hold --------------------------------------------------------

    def hold(self, lease: Lease) -> None:
        """``lease`` is held from now on: the watchdog renews it and re-entry finds it."""
        keeper = self.keeper
        assert keeper is not None
        keeper.add(lease)
        self.holds.add(lease)

    def body_ended(self) -> None:
        """A body under one of this client's leases ended, or a release returned (a drain waits for them)."""
        if self.body_left is not None:
            self.body_left.set()

    def forget(self, lease: Lease) -> None:
        """``lease`` is held no more: stop watching its owner task and its cap, and drop it from the table."""
        lease._detach()
        self.holds.remove(lease)

    def cap(self, lease: Lease, max_hold: float) -> None:
        """Lose ``lease`` (its bodies cancelled, the lock released) once it has been held ``max_hold`` seconds."""
        lease._cap_at(lease._acquired_at + max_hold)

    def watch_owner(self, lease: Lease) -> None:
        """Abandon ``lease`` if the running task (its owner) ends while holding it."""
        task = asyncio.current_task()
        assert task is not None
        lease._watch_owner(task, self._owner_ended)

    def _owner_ended(self, lease: Lease, task: asyncio.Task[Any]) -> None:
        """The owner task of ``lease`` ended still holding it: release it now, and say so."""
        if not lease._held or self.closed:
            return
        if self.keeper is not None:
            self.keeper.remove(lease)
        self.forget(lease)
        lease._mark_released()
        logger.warning(
            "lock %r abandoned: its owner task %r ended while holding it (hold count %d); releasing it."
            " Release before the task ends, or acquire with detached=True to keep a lock beyond a task.",
            lease.name,
            task.get_name(),
            lease.hold_count,
        )
        self.events.emit(
            "abandoned", lease.name, lease.owner, lease.token, held_s=lease._held_for(), reason="owner task ended"
        )
        self.give_back(lease)

    async def release(self, lease: Lease) -> None:
        """Release every hold of ``lease`` on the server (``Lock.release`` at zero, ``lease.release()``)."""
        if lease._released or lease.lost:
            raise NotHeld(lease.name, "this lease was already released or lost")
        keeper = self.keeper
        assert keeper is not None
        # Deregister before the release request is sent: no renewal can follow it.
        keeper.remove(lease)
        self.forget(lease)
        lease._mark_released()
        if lease._bodies() and lease.owner != current_owner():
            lease._cancel_bodies()  # released from another task: the bodies that held it no longer do
        held_s = lease._held_for() if self.events.callback is not None else None
        self.releasing += 1
        try:
            released = await release_by_identity(self.backend, lease, raise_errors=True, deadlines=self.deadlines)
        except asyncio.CancelledError:
            # The caller is cancelled; the hold must still go. A release by the
            # hold's identity is idempotent, so repeating one that may have gone
            # out already is harmless.
            self.give_back(lease)
            raise
        finally:
            self.releasing -= 1
            self.body_ended()
        if not released:
            lease._release_refused("the server no longer had this hold at release (expired or taken)")
            raise NotHeld(lease.name, "the lease had expired or been taken before release")
        if held_s is not None:
            self.events.emit("released", lease.name, lease.owner, lease.token, held_s=held_s)
        hub = self.hub
        if hub is not None and lease._key.kind == "lock" and hub.waiting(lease.name):
            # One event-loop turn before the caller goes on: a waiter this
            # release woke in this process tries first, instead of losing every
            # time to the releasing task's next acquire (which would starve it).
            await asyncio.sleep(0)

    def lease_lost(self, lease: Lease, reason: str, loss: LossReason) -> None:
        """``lease`` was lost (its ``_lose`` calls this once): forget it, say so, and give it back by identity."""
        self.forget(lease)
        if self.keeper is not None:
            self.keeper.remove(lease)
        logger.warning("lock %r lost by %s: %s", lease.name, lease.owner, reason)
        self.events.emit(
            "lost", lease.name, lease.owner, lease.token, held_s=lease._held_for(), reason=reason, loss=loss
        )
        # If the server may still have it (the deadline passed while renewals
        # were stuck), give it back by identity; harmless if it is gone.
        self.give_back(lease, quiet=True)

    def _lease_at_risk(self, lease: Lease, reason: str) -> None:
        logger.info("lock %r at risk for %s: %s", lease.name, lease.owner, reason)
        self.events.emit("at_risk", lease.name, lease.owner, lease.token, reason=reason)

    def _renewed(self, lease: Lease) -> None:
        self.events.emit("renewed", lease.name, lease.owner, lease.token)

    # -- what the backend reports through the hub ----------------------------------

    def _lose(self, holds: Sequence[str] | None, reason: str, loss: LossReason) -> None:
        if self.keeper is not None:
            self.keeper.lose(None if holds is None else list(holds), reason, loss)

    def _at_risk(self, holds: Sequence[str] | None, reason: str) -> None:
        if self.keeper is not None:
            self.keeper.at_risk(None if holds is None else list(holds), reason)
