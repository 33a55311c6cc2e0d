"""Locks: the client. It makes handles, owns the backend, the one LeaseKeeper
and the one WakeHub, and does what happens to a lease outside an acquire:
release, loss, abandonment, close, and the events that report them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ._errors import NotHeld
from ._keeper import LeaseKeeper
from ._lease import Lease
from ._owner import current_owner
from ._release import release_by_identity
from ._timing import REQUEST_WINDOW, Deadlines
from ._validate import check_name, check_ttl
from ._values import EventKind, LockEvent, LossReason
from ._wake import WakeHub
from .abc import Backend, LockRef, Notifies

if TYPE_CHECKING:
    from ._election import Election
    from ._lock import Lock, RWLock, Semaphore
    from ._singleton import Singleton

__all__ = ["EventCallback", "Locks"]

logger = logging.getLogger("asynclock")

EventCallback = Callable[[LockEvent], object]

P = ParamSpec("P")
R = TypeVar("R")

#: What every call on a closed client raises.
CLIENT_CLOSED = "client is closed"


class Locks:
    """A client of one lock service: the factory of ``Lock`` handles.

    Made by :func:`asynclock.connect`. Use it as an async context manager (or
    call :meth:`aclose`); leaving it releases every lease it still holds, stops
    its watchdog and listener, and closes what it opened. Every call on a
    closed client raises ``RuntimeError("client is closed")``.

    Example::

        async with asynclock.connect("redis://localhost:6379/0") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float = 30.0,
        on_event: EventCallback | None = None,
    ) -> None:
        self._backend = backend
        self._notifies = isinstance(backend, Notifies)
        self._ttl = check_ttl(ttl)
        self._on_event = on_event
        self.client_id = secrets.token_hex(8)
        # lock (as held for re-entry) -> owner -> lease
        self._holds: dict[LockRef, dict[str, Lease]] = {}
        # (read-write lock name, owner) -> read acquisitions joined to that owner's write hold
        self._joined: dict[tuple[str, str], int] = {}
        # tasks waiting in a server's queue -> whether aclose cancelled them
        self._waits: dict[asyncio.Task[Any], bool] = {}
        self._waits_ended: asyncio.Event | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # loop timers of what is due later (the end of a singleton job's at_least)
        self._timers: set[asyncio.TimerHandle] = set()
        self._hold_seq = itertools.count(1)
        self._keeper: LeaseKeeper | None = None
        self._hub: WakeHub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._deadlines = Deadlines()

    def __repr__(self) -> str:
        return f"<Locks {self._backend.scheme} client={self.client_id}>"

    @property
    def backend(self) -> Any:
        """The backend (for tests and tools)."""
        return getattr(self._backend, "legacy", self._backend)

    @property
    def ttl(self) -> float:
        """The default lease time of this client's locks, in seconds."""
        return self._ttl

    def lock(self, name: str, *, ttl: float | None = None, fair: bool = False) -> Lock:
        """A handle on the lock ``name``; cheap, no I/O.

        ``fair=True`` makes it FIFO: waiters get it in the order their acquire
        reached the server, a new acquire (even ``timeout=0``) never jumps the
        queue, and a release wakes only the next in line. A fair and a plain
        lock of the same name are different locks on backends whose plain lock
        is not FIFO already.

        Raises TypeError / ValueError for a bad name or ttl, and
        NotImplementedError when the backend has no fair lock.
        """
        from ._lock import Lock

        self._check_open()
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
        return Lock(self, LockRef("fair" if fair else "lock", check_name(name)), self._check_ttl(ttl))

    def rw_lock(self, name: str, *, ttl: float | None = None) -> RWLock:
        """A read-write lock: ``.read`` may be held by many tasks at once, ``.write`` by one.

        A waiting writer keeps new readers out, so a stream of readers cannot
        starve it. The holder of ``.write`` may also take ``.read`` (it joins
        the write hold); taking ``.write`` while holding only ``.read`` raises
        :class:`LockError` instead of deadlocking. Cheap, no I/O.
        """
        from ._lock import RWLock

        self._check_open()
        return RWLock(self, check_name(name), self._check_ttl(ttl))

    def semaphore(self, name: str, *, permits: int, ttl: float | None = None) -> Semaphore:
        """A semaphore: at most ``permits`` tasks, across every client, hold it at once.

        Each holder has its own lease (watchdog, fencing token, loss →
        cancellation); a holder that dies gives its permit back when its lease
        runs out. Every client of a name must use the same ``permits``: an
        acquire that asks with another number than the current users' raises
        ValueError. Cheap, no I/O.
        """
        from ._lock import Semaphore

        self._check_open()
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise TypeError(f"permits must be an int, not {type(permits).__name__}")
        if not 1 <= permits <= 100_000:
            raise ValueError(f"permits must be between 1 and 100000, got {permits}")
        return Semaphore(self, check_name(name), self._check_ttl(ttl), permits)

    def election(self, name: str, *, identity: str | None = None, ttl: float | None = None) -> Election:
        """A leader election among every client that names it; cheap, no I/O.

        ``identity`` is what ``leader()``, ``observe()`` and ``asynclock
        inspect`` show for this candidate (default: ``host:pid:task`` of the
        task that enters ``leadership()``); ``ttl`` the lease time of a
        term. Raises NotImplementedError when the backend has no elections,
        TypeError / ValueError for a bad name, identity or ttl.
        """
        from ._election import Election

        self._check_open()
        return Election(self, check_name(name), identity, self._check_ttl(ttl))

    def singleton(
        self, name: str, *, at_most: float, at_least: float = 0.0, ttl: float | None = None
    ) -> Callable[[Callable[P, Awaitable[R]]], Singleton[P, R]]:
        """A decorator: the async function runs on one replica at a time, at most once per ``at_least`` seconds.

        Calling the decorated function runs it here, unless another replica
        runs it or started it less than ``at_least`` seconds ago (it returns
        None then); ``at_most`` cancels a run that lasts longer. The job holds
        the lock ``name`` (``locks.lock(name)`` is that lock). See
        :class:`~asynclock.Singleton`. Raises TypeError / ValueError for bad
        arguments (``at_least`` above ``at_most`` too), before any I/O.

        Example::

            @locks.singleton("nightly-report", at_most=600, at_least=60)
            async def nightly_report() -> None: ...
        """
        from ._singleton import make_singleton

        self._check_open()
        return make_singleton(self, name, at_most, at_least, ttl)

    async def __aenter__(self) -> Locks:
        try:
            await self._ensure_started()
        except BaseException:
            # A block that was never entered is never left: close what the start opened.
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release every held lease, stop the watchdog and listeners, close connections."""
        if self._closed:
            return
        self._closed = True
        for timer in self._timers:
            timer.cancel()  # what they were due to release is released below
        self._timers.clear()
        if self._hub is not None:
            self._hub.wake_all()  # waiting acquires of other tasks see the client closed
        waiting = list(self._waits)
        for task in waiting:
            self._waits[task] = True  # the acquire turns this cancellation into BackendUnavailable
            task.cancel()
        if self._keeper is not None:
            leases = self._keeper.holds()
            me = current_owner()
            now = asyncio.get_running_loop().time()
            for lease in leases:
                self._keeper.remove(lease)
                self._forget(lease)
            # A singleton job's lock stays held until its at_least has passed: its last
            # renewal made the server's hold last that long (a session's ends with it).
            leases = [lease for lease in leases if lease._hold_until is None or lease._hold_until <= now]
            for lease in leases:
                # Like a loss: every body under it is cancelled before the
                # release below lets anybody else in.
                lease._close("the client was closed while the lock was held", spare_owner=me)
            if leases:
                # A courtesy to the next holder, bounded: a hold we cannot
                # release now expires by itself (nobody renews it any more).
                soon = asyncio.get_running_loop().time() + 2 * REQUEST_WINDOW
                await asyncio.gather(
                    *(release_by_identity(self._backend, lease, raise_errors=False, give_up=soon) for lease in leases),
                    return_exceptions=True,
                )
            await self._keeper.aclose()
        if waiting and self._waits:
            # Let the cancelled waits leave their queues (they start their clean-ups) first.
            self._waits_ended = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * REQUEST_WINDOW):
                    await self._waits_ended.wait()
        if self._background:
            _, pending = await asyncio.wait(list(self._background), timeout=2 * REQUEST_WINDOW)
            for task in pending:
                task.cancel()
        if self._loop is not None:
            await self._backend.aclose()

    # -- internal -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(CLIENT_CLOSED)

    def _check_ttl(self, ttl: float | None) -> float:
        if ttl is None:
            return self._ttl
        ttl = check_ttl(ttl)
        # A backend whose lease is bounded by something else (ZooKeeper's
        # session) refuses, here and without I/O, a ttl it cannot carry.
        fits = getattr(self._backend, "check_ttl", None) or getattr(self.backend, "check_ttl", None)
        if fits is not None:
            fits(ttl)
        return ttl

    async def _ensure_started(self) -> LeaseKeeper:
        self._check_open()
        keeper = self._keeper
        if keeper is not None:
            if self._loop is not asyncio.get_running_loop():
                raise RuntimeError("a Locks client belongs to the event loop it was first used in")
            return keeper
        loop = asyncio.get_running_loop()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._keeper is None:
                self._loop = loop
                backend = self._backend
                hub = WakeHub(
                    backend if isinstance(backend, Notifies) else None, self._background, self._lose, self._at_risk
                )
                await backend.start(hub)
                self._hub = hub
                self._keeper = LeaseKeeper(
                    backend, self._renewed if self._on_event is not None else None, self._lease_at_risk
                )
            return self._keeper

    def _wait_ended(self, task: asyncio.Task[Any]) -> bool:
        """``task`` left ``wait_queued``; whether it was because the client was closed."""
        closed = self._waits.pop(task, False)
        if not self._waits and self._waits_ended is not None:
            self._waits_ended.set()
        return closed

    def _lose(self, holds: Sequence[str] | None, reason: str, loss: LossReason) -> None:
        if self._keeper is not None:
            self._keeper.lose(None if holds is None else list(holds), reason, loss)

    def _new_hold(self, owner: str) -> str:
        return f"{self.client_id}:{owner}:{next(self._hold_seq)}"

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _later(self, when: float, callback: Callable[[], object]) -> None:
        """Call ``callback`` at the loop time ``when``, unless the client is closed first."""

        def fire() -> None:
            self._timers.discard(handle)
            callback()

        handle = asyncio.get_running_loop().call_at(when, fire)
        self._timers.add(handle)

    def _forget(self, lease: Lease) -> None:
        task, done = lease._owner_task, lease._owner_done
        if task is not None and done is not None:
            lease._owner_task = lease._owner_done = None
            task.remove_done_callback(done)
        key = lease._key
        if key.kind == "write":
            # The reads this owner joined to the write hold end with it.
            self._joined.pop((lease.name, lease.owner), None)
        owners = self._holds.get(key)
        if owners is not None and owners.get(lease.owner) is lease:
            del owners[lease.owner]
            if not owners:
                del self._holds[key]

    def _watch_owner(self, lease: Lease) -> None:
        """Abandon ``lease`` if the running task (its owner) ends while holding it."""
        task = asyncio.current_task()
        assert task is not None
        if lease._owner_task is task:
            return
        lease._owner_task = task
        lease._owner_done = functools.partial(self._owner_ended, lease)
        task.add_done_callback(lease._owner_done)

    def _owner_ended(self, lease: Lease, task: asyncio.Task[Any]) -> None:
        """The owner task of ``lease`` ended still holding it: release it now, and say so."""
        lease._owner_task = lease._owner_done = None
        if not lease._held or self._closed:
            return
        if self._keeper is not None:
            self._keeper.remove(lease)
        self._forget(lease)
        lease._released = True
        logger.warning(
            "lock %r abandoned: its owner task %r ended while holding it (hold count %d); releasing it."
            " Release before the task ends, or acquire with detached=True to keep a lock beyond a task.",
            lease.name,
            task.get_name(),
            lease.hold_count,
        )
        held = asyncio.get_running_loop().time() - lease._acquired_at
        self._emit("abandoned", lease.name, lease.owner, lease.token, held_s=held, reason="owner task ended")
        self._spawn(release_by_identity(self._backend, lease, raise_errors=False))

    async def _release_lease(self, lease: Lease) -> None:
        """Release every hold of ``lease`` on the server (``Lock.release`` at zero, ``lease.release()``)."""
        if lease._released or lease.lost:
            raise NotHeld(lease.name, "this lease was already released or lost")
        keeper = self._keeper
        assert keeper is not None
        # Deregister before the release request is sent: no renewal can follow it.
        keeper.remove(lease)
        self._forget(lease)
        lease._released = True
        if lease._scopes and lease.owner != current_owner():
            # Released from another task: the bodies that held it no longer do.
            for scope in lease._scopes:
                scope.cancel()
        held_s = asyncio.get_running_loop().time() - lease._acquired_at
        try:
            released = await release_by_identity(self._backend, lease, raise_errors=True, deadlines=self._deadlines)
        except asyncio.CancelledError:
            # The caller is cancelled; the hold must still go. A release by the
            # hold's identity is idempotent, so repeating one that may have gone
            # out already is harmless.
            self._spawn(release_by_identity(self._backend, lease, raise_errors=False))
            raise
        if not released:
            lease._released = False
            lease._lose("the server no longer had this hold at release (expired or taken)", LossReason.TAKEN_OR_EXPIRED)
            raise NotHeld(lease.name, "the lease had expired or been taken before release")
        self._emit("released", lease.name, lease.owner, lease.token, held_s=held_s)
        hub = self._hub
        if hub is not None and lease._key.kind == "lock" and hub.waiting(lease.name):
            # One event-loop turn before the caller goes on: a waiter this
            # release woke in this process tries first, instead of losing every
            # time to the releasing task's next acquire (which would starve it).
            await asyncio.sleep(0)

    def _lease_lost(self, lease: Lease, reason: str, loss: LossReason) -> None:
        self._forget(lease)
        if self._keeper is not None:
            self._keeper.remove(lease)
        logger.warning("lock %r lost by %s: %s", lease.name, lease.owner, reason)
        held = asyncio.get_running_loop().time() - lease._acquired_at
        self._emit("lost", lease.name, lease.owner, lease.token, held_s=held, reason=reason, loss=loss)
        # If the server may still have it (the deadline passed while renewals
        # were stuck), give it back by identity; harmless if it is gone.
        self._spawn(release_by_identity(self._backend, lease, raise_errors=False))

    def _lease_at_risk(self, lease: Lease, reason: str) -> None:
        logger.info("lock %r at risk for %s: %s", lease.name, lease.owner, reason)
        self._emit("at_risk", lease.name, lease.owner, lease.token, reason=reason)

    def _at_risk(self, holds: Sequence[str] | None, reason: str) -> None:
        if self._keeper is not None:
            self._keeper.at_risk(None if holds is None else list(holds), reason)

    def _renewed(self, lease: Lease) -> None:
        if self._on_event is not None:
            self._emit("renewed", lease.name, lease.owner, lease.token)

    def _emit(
        self,
        kind: EventKind,
        name: str,
        owner: str,
        token: int | None,
        *,
        wait_s: float | None = None,
        held_s: float | None = None,
        reason: str | None = None,
        loss: LossReason | None = None,
    ) -> None:
        if self._on_event is None:
            return
        event = LockEvent(kind, name, f"{self.client_id}:{owner}", token, wait_s, held_s, reason, loss)
        asyncio.get_running_loop().call_soon(self._deliver, event)

    def _deliver(self, event: LockEvent) -> None:
        assert self._on_event is not None
        try:
            self._on_event(event)
        except Exception:
            logger.exception("on_event callback failed for %s", event)
