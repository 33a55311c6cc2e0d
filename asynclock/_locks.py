"""Locks (the client) and Lock (the backend-agnostic front).

Everything that is the same for every backend is written here once: owner
identity, reentrancy bookkeeping, waiting with a timeout, cancel-safe acquire
and release, the cancel scope around ``async with``, events and logging.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio

from ._errors import BackendUnavailable, ConfigurationError, LockError, LockLost, LockTimeout, NotHeld
from ._lease import Lease, LeaseKeeper
from ._notify import WakeHub
from ._validate import check_name, check_timeout, check_ttl
from ._values import EventKind, LockEvent, LockInfo
from .abc import LOCK, Acquired, Busy, Shape

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .abc import Backend

logger = logging.getLogger("asynclock")

T = TypeVar("T")

EventCallback = Callable[[LockEvent], object]

_task_ids: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_task_counter = itertools.count(1)

#: First and largest pause between retries of a request that failed to reach the server.
_RETRY_FIRST = 0.02
_RETRY_MAX = 1.0
#: Longest time a single request may take before it counts as failed, when
#: the caller's own timeout is shorter (capped at a third of the lease time).
_REQUEST_WINDOW = 1.0
#: Why an acquire in progress ends when its client is closed (like a queued wait does).
_CLOSED = "the Locks client was closed while this acquire was in progress"


def current_owner() -> str:
    """The owner id of the running task (unique for the process's lifetime)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("asynclock locks are owned by asyncio tasks: call this from inside a task")
    number = _task_ids.get(task)
    if number is None:
        number = _task_ids[task] = next(_task_counter)
    return f"task-{number}"


class Locks:
    """A client of one lock service: the factory of ``Lock`` handles.

    Made by :func:`asynclock.connect`. Use it as an async context manager (or
    call :meth:`aclose`); leaving it releases every lease it still holds, stops
    its watchdog and listener, and closes what it opened.

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
        self._ttl = check_ttl(ttl)
        self._on_event = on_event
        self.client_id = secrets.token_hex(8)
        # (shape, name) -> owner -> lease
        self._holds: dict[tuple[Shape, str], dict[str, Lease]] = {}
        # shape -> its adapter and, once started, the hub of its waiters
        # (the plain lock's adapter is the backend itself, or its FIFO queue on
        # a backend whose plain lock is one: one Redis server, Sentinel)
        self._adapters: dict[Shape, Backend] = {LOCK: backend.primitive(LOCK)}
        self._hubs: dict[Shape, WakeHub] = {}
        # (read-write lock name, owner) -> read acquisitions joined to that owner's write hold
        self._joined: dict[tuple[str, str], int] = {}
        # waits in a server's queue (wait_acquire tasks) in progress: aclose cancels them
        self._queued: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._hold_seq = itertools.count(1)
        self._keeper: LeaseKeeper | None = None
        self._hub: WakeHub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<Locks {self._backend.kind} client={self.client_id}>"

    @property
    def backend(self) -> Backend:
        """The backend adapter (for tests and tools)."""
        return self._backend

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
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
        return Lock(self, check_name(name), self._check_ttl(ttl), Shape("fair") if fair else LOCK)

    def rw_lock(self, name: str, *, ttl: float | None = None) -> RWLock:
        """A read-write lock: ``.read`` may be held by many tasks at once, ``.write`` by one.

        A waiting writer keeps new readers out, so a stream of readers cannot
        starve it. The holder of ``.write`` may also take ``.read`` (it joins
        the write hold); taking ``.write`` while holding only ``.read`` raises
        :class:`LockError` instead of deadlocking. Cheap, no I/O.
        """
        return RWLock(self, check_name(name), self._check_ttl(ttl))

    def semaphore(self, name: str, *, permits: int, ttl: float | None = None) -> Semaphore:
        """A semaphore: at most ``permits`` tasks, across every client, hold it at once.

        Each holder has its own lease (watchdog, fencing token, loss →
        cancellation); a holder that dies gives its permit back when its lease
        runs out. Every client of a name must use the same ``permits``. Cheap,
        no I/O.
        """
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise TypeError(f"permits must be an int, not {type(permits).__name__}")
        if not 1 <= permits <= 100_000:
            raise ValueError(f"permits must be between 1 and 100000, got {permits}")
        return Semaphore(self, check_name(name), self._check_ttl(ttl), permits)

    async def __aenter__(self) -> Locks:
        await self._ensure_started()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _check_ttl(self, ttl: float | None) -> float:
        return self._ttl if ttl is None else check_ttl(ttl)

    def _adapter(self, shape: Shape) -> Backend:
        """The backend adapter of ``shape``, made on first use, without I/O."""
        adapter = self._adapters.get(shape)
        if adapter is None:
            adapter = self._adapters[shape] = self._backend.primitive(shape)
        return adapter

    async def aclose(self) -> None:
        """Release every held lease, stop the watchdog and listeners, close connections."""
        if self._closed:
            return
        self._closed = True
        for hub in self._hubs.values():
            hub.wake_all()  # waiting acquires of other tasks see the client closed
        queued = list(self._queued)
        for task in queued:
            task.cancel()  # and those queued on the server leave the queue
        if self._keeper is not None:
            leases = self._keeper.holds()
            me = current_owner()
            for lease in leases:
                self._keeper.remove(lease)
                self._forget(lease)
                # Like a loss: every body under it is cancelled before the
                # release below lets anybody else in (but not the caller's own
                # body, which would cut this close short; it gets LockLost on leaving).
                lease._reason = "the client was closed while the lock was held"
                if lease._lost_event is not None:
                    lease._lost_event.set()
                if lease.owner != me:
                    for scope in lease._scopes:
                        scope.cancel()
            if leases:
                # A courtesy to the next holder, bounded: a hold we cannot
                # release now expires by itself (nobody renews it any more).
                soon = asyncio.get_running_loop().time() + 2 * _REQUEST_WINDOW
                await asyncio.gather(
                    *(self._release_on_server(lease, raise_errors=False, give_up=soon) for lease in leases),
                    return_exceptions=True,
                )
            await self._keeper.aclose()
        if queued:
            # Let them leave the queue (and their acquires start any clean-up) before closing.
            await asyncio.wait(queued, timeout=2 * _REQUEST_WINDOW)
            for _ in range(3):  # the acquires wake one turn after their wait ends, and spawn clean-ups
                await asyncio.sleep(0)
        if self._background:
            _, pending = await asyncio.wait(list(self._background), timeout=2 * _REQUEST_WINDOW)
            for task in pending:
                task.cancel()
        if self._loop is not None or self._keeper is not None:
            # Each adapter once (the plain lock's may be the fair lock's too), the backend last.
            adapters = [self._adapters[shape] for shape in self._hubs if shape != LOCK]
            adapters.append(self._adapters[LOCK])
            closed: set[int] = {id(self._backend)}
            for adapter in adapters:
                if id(adapter) not in closed:
                    closed.add(id(adapter))
                    with contextlib.suppress(LockError, OSError):
                        await adapter.aclose()
            for shape in [shape for shape in self._hubs if shape != LOCK]:
                del self._hubs[shape]
            await self._backend.aclose()

    # -- internal -------------------------------------------------------------

    async def _ensure_started(self) -> tuple[LeaseKeeper, WakeHub]:
        if self._closed:
            raise RuntimeError("this Locks client is closed")
        keeper, hub = self._keeper, self._hub
        if keeper is not None and hub is not None:
            if self._loop is not asyncio.get_running_loop():
                raise RuntimeError("a Locks client belongs to the event loop it was first used in")
            return keeper, hub
        loop = asyncio.get_running_loop()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._keeper is None or self._hub is None:
                self._loop = loop
                hub = WakeHub(self._backend, self._background)
                hub.lose = self._lose_from_backend  # type: ignore[method-assign]
                await self._backend.start(hub)
                self._hub = self._hubs[LOCK] = hub
                self._keeper = LeaseKeeper(self._renewed)
            return self._keeper, self._hub

    async def _ensure_shape(self, shape: Shape) -> tuple[LeaseKeeper, WakeHub]:
        """Like ``_ensure_started``, for the adapter of ``shape`` (started once, with its own hub)."""
        keeper, hub = await self._ensure_started()
        if shape == LOCK:
            return keeper, hub
        found = self._hubs.get(shape)
        if found is not None:
            return keeper, found
        assert self._start_lock is not None
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("this Locks client is closed")
            found = self._hubs.get(shape)
            if found is None:
                adapter = self._adapter(shape)
                found = WakeHub(adapter, self._background)
                found.lose = self._lose_from_backend  # type: ignore[method-assign]
                await adapter.start(found)
                self._hubs[shape] = found
            return keeper, found

    def _lose_from_backend(self, holds: Sequence[str] | None, reason: str) -> None:
        if self._keeper is not None:
            self._keeper.lose(None if holds is None else list(holds), reason)

    def _new_hold(self, owner: str) -> str:
        return f"{self.client_id}:{owner}:{next(self._hold_seq)}"

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _forget(self, lease: Lease) -> None:
        if lease._shape.kind == "write":
            # The reads this owner joined to the write hold end with it.
            self._joined.pop((lease.name, lease.owner), None)
        key = (lease._shape, lease.name)
        owners = self._holds.get(key)
        if owners is not None and owners.get(lease.owner) is lease:
            del owners[lease.owner]
            if not owners:
                del self._holds[key]

    def _lease_lost(self, lease: Lease, reason: str) -> None:
        self._forget(lease)
        if self._keeper is not None:
            self._keeper.remove(lease)
        logger.warning("lock %r lost by %s: %s", lease.name, lease.owner, reason)
        held = asyncio.get_running_loop().time() - lease._acquired_at
        self._emit("lost", lease.name, lease.owner, lease.token, held_s=held, reason=reason)
        # If the server may still have it (the deadline passed while renewals
        # were stuck), give it back by identity; harmless if it is gone.
        self._spawn(self._release_on_server(lease, raise_errors=False))

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
    ) -> None:
        if self._on_event is None:
            return
        event = LockEvent(kind, name, f"{self.client_id}:{owner}", token, wait_s, held_s, reason)
        asyncio.get_running_loop().call_soon(self._deliver, event)

    def _deliver(self, event: LockEvent) -> None:
        assert self._on_event is not None
        try:
            self._on_event(event)
        except Exception:
            logger.exception("on_event callback failed for %s", event)

    async def _release_on_server(self, lease: Lease, *, raise_errors: bool, give_up: float | None = None) -> bool:
        """Release ``lease`` by its identity, retrying failed requests.

        With ``raise_errors`` (an explicit ``release()``) it retries until the
        lease's trusted deadline (at least one request window) and then raises
        BackendUnavailable; otherwise (background clean-up) until the server
        must have expired the hold by itself, and then gives up quietly.
        """
        loop = asyncio.get_running_loop()
        # Past this time the server has expired the hold by itself.
        expired = lease._expires_at + 2 * lease._ttl
        now = loop.time()
        if give_up is not None:
            pass
        elif raise_errors:
            give_up = max(lease._expires_at, now + min(lease._lease_time / 3, _REQUEST_WINDOW))
        else:
            give_up = max(expired, now + 0.05)
        delay = _RETRY_FIRST
        ambiguous = False
        while True:
            try:
                async with asyncio.timeout_at(give_up):
                    released = await lease._backend.release(lease.name, lease._hold)
            except (LockError, OSError, TimeoutError) as exc:
                ambiguous = True
                if isinstance(exc, ConfigurationError) or loop.time() + delay >= give_up:
                    if raise_errors:
                        raise _unavailable(exc) from exc
                    logger.info("could not release %r (%r); it expires by itself", lease.name, exc)
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            # After a failed attempt whose fate is unknown, "not the holder" may
            # mean that attempt went through: the lock is free either way.
            return released or (ambiguous and loop.time() < lease._expires_at)


class _HoldRetired(Exception):
    """An attempt whose hold id is being rolled back: retry under a new id."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.__cause__ = cause


def _unavailable(exc: BaseException) -> LockError:
    """``exc`` as what a caller sees: BackendUnavailable, or a ConfigurationError as it is."""
    if isinstance(exc, (BackendUnavailable, ConfigurationError)):
        return exc
    return BackendUnavailable(f"lock server did not answer in time: {exc!r}")


class Lock:
    """A distributed lock; made by ``locks.lock(name)``.

    Owned by the asyncio task that acquires it; the same task may acquire it
    again (re-entry) and must release it as many times. Another task, in this
    process or elsewhere, waits.

    Example::

        lock = locks.lock("orders:42")
        async with lock as lease:       # waits until held
            await charge(order, fencing_token=lease.token)
        # if the lease is lost inside, the body is cancelled and LockLost is raised

    ``acquire(timeout=...)`` raises :class:`LockTimeout`; ``release()`` raises
    :class:`NotHeld` when the current task holds nothing; server trouble that
    outlasts the operation raises :class:`BackendUnavailable`.
    """

    __slots__ = ("_backend", "_key", "_locks", "_scopes", "_shape", "name", "ttl")

    def __init__(self, locks: Locks, name: str, ttl: float, shape: Shape = LOCK) -> None:
        self._locks = locks
        self.name = name
        self.ttl = ttl
        self._backend = locks._adapter(shape)  # NotImplementedError before any I/O
        self._shape = shape
        held_as = shape
        if shape != LOCK and self._backend.lock_key(name) == locks._adapter(LOCK).lock_key(name):
            # The same lock on the server as the plain lock of this name (the fair
            # lock where the plain lock is FIFO already: one Redis, ZooKeeper, PostgreSQL):
            # one hold per task, whichever handle took it, so re-entry works across them.
            held_as = LOCK
        self._key = (held_as, name)
        self._scopes: dict[str, list[tuple[Lease, anyio.CancelScope]]] = {}

    def __repr__(self) -> str:
        fair = " fair" if self._shape.kind == "fair" else ""
        return f"<Lock {self.name!r}{fair} ttl={self.ttl}>"

    @property
    def key(self) -> str:
        """The backend's own name for this lock (Redis key, znode path, advisory key)."""
        return self._backend.lock_key(self.name)

    @property
    def held(self) -> bool:
        """Whether the current task holds this lock, as far as this client knows."""
        return self._holding()

    def _holding(self) -> bool:
        lease = self._locks._holds.get(self._key, {}).get(current_owner())
        return lease is not None and not lease.lost

    async def info(self) -> LockInfo:
        """What the server knows: holder, hold count, remaining ttl, waiters, token."""
        await self._locks._ensure_shape(self._shape)
        backend = self._backend
        window = min(backend.lease_time(self.ttl) / 3, _REQUEST_WINDOW)
        try:
            async with asyncio.timeout(window):
                try:
                    info = await backend.info(self.name)
                except ConfigurationError:
                    raise
                except (LockError, OSError):
                    info = await backend.info(self.name)  # read-only: one retry on a fresh connection
        except (LockError, OSError, TimeoutError) as exc:
            raise _unavailable(exc) from exc
        if info.owner is not None and not info.holders:
            info = dataclasses.replace(info, holders=(info.owner,))
        return info

    async def acquire(self, *, timeout: float | None = None) -> Lease:
        """Wait until this task holds the lock and return the Lease.

        ``timeout=None`` waits forever, ``timeout=0`` tries once. Raises
        :class:`LockTimeout` when the time runs out, :class:`BackendUnavailable`
        when the server could not be reached in that time. Cancelling the
        caller never leaves the lock held.
        """
        timeout = check_timeout(timeout)
        locks = self._locks
        keeper, hub = await locks._ensure_shape(self._shape)
        owner = current_owner()
        held = locks._holds.get(self._key, {}).get(owner)
        if held is not None:
            return await self._reenter(held)

        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if timeout is None else started + timeout
        hold = locks._new_hold(owner)
        if self._backend.queues_waiters:
            return await self._acquire_queued(hold, owner, timeout, keeper, started)
        # A request that fails to reach the server is retried for a while even
        # with timeout=0, which means "do not wait for the holder", not "do not
        # wait for the server".
        window = min(self._backend.lease_time(self.ttl) / 3, _REQUEST_WINDOW)
        server_deadline = None if deadline is None else max(deadline, started + window)
        result: Lease | Busy | BaseException | None = None
        if not hub.subscribed(self.name):
            # Fast path: an uncontended acquire is one round trip, no subscription.
            # (When this client already listens for the name, registering first
            # makes the very first try count as "after subscribing".)
            result = await self._attempt(hold, owner, server_deadline, keeper)
            if isinstance(result, Lease):
                return self._got(result, started)
            if isinstance(result, _HoldRetired):
                hold = locks._new_hold(owner)
            if isinstance(result, Busy) and deadline is not None and loop.time() >= deadline:
                self._give_up(hold, owner, result, timeout, started)
        # Subscribe first, then try, then wait for a release notification or
        # the holder's remaining lease, whichever comes first.
        delay = _RETRY_FIRST
        failing_since: float | None = None
        last_busy: Busy | None = result if isinstance(result, Busy) else None
        async with hub.watch(self.name) as waiter:
            while True:
                waiter.clear()
                if locks._closed:
                    raise BackendUnavailable(_CLOSED)
                result = await self._attempt(hold, owner, server_deadline, keeper)
                if isinstance(result, Lease):
                    return self._got(result, started)
                if isinstance(result, _HoldRetired):
                    hold = locks._new_hold(owner)
                now = loop.time()
                if isinstance(result, Busy):
                    last_busy = result
                    if deadline is not None and now >= deadline:
                        self._give_up(hold, owner, result, timeout, started)
                    failing_since, delay = None, _RETRY_FIRST
                    wait = None if deadline is None else deadline - now
                    if result.retry_after is not None:
                        wait = result.retry_after if wait is None else min(wait, result.retry_after)
                else:
                    # The server did not answer: back off, but never wait
                    # forever for a server that stays away.
                    failing_since = now if failing_since is None else failing_since
                    if deadline is not None and now >= deadline and last_busy is not None:
                        # The server answered "taken" before; the time is up. This
                        # try may have gone through unseen: give it back by identity.
                        if not isinstance(result, _HoldRetired):  # (a retired one is rolled back)
                            self._probe_release(hold, owner)
                        self._give_up(hold, owner, last_busy, timeout, started)
                    if server_deadline is not None and now >= server_deadline:
                        self._give_up(hold, owner, result, timeout, started)
                    # A server that cannot even be connected to is given up on
                    # after the connect timeout; one that stopped answering, after a ttl.
                    unreachable = result.connect_timeout if isinstance(result, BackendUnavailable) else None
                    limited = server_deadline is None or unreachable is not None
                    patience = self.ttl if unreachable is None else min(self.ttl, unreachable)
                    if limited and now - failing_since >= patience:
                        self._give_up(hold, owner, result, timeout, started)
                    wait = min(delay, failing_since + patience - now) if limited else delay
                    if server_deadline is not None:
                        wait = min(wait, server_deadline - now)
                    delay = min(delay * 2, _RETRY_MAX)
                await waiter.wait(wait)

    async def release(self) -> None:
        """Undo one ``acquire`` of the current task.

        Raises :class:`NotHeld` if the current task holds nothing (never
        acquired, already released, or the lease was lost), and changes nothing
        on the server then.
        """
        locks = self._locks
        owner = current_owner()
        lease = locks._holds.get(self._key, {}).get(owner)
        if lease is None or lease.lost:
            raise NotHeld(self.name)
        if lease.hold_count > 1:
            lease.hold_count -= 1
            await self._record_count(lease)
            return
        keeper = locks._keeper
        assert keeper is not None
        # Deregister before the release request is sent: no renewal can follow it.
        keeper.remove(lease)
        locks._forget(lease)
        lease._released = True
        held_s = asyncio.get_running_loop().time() - lease._acquired_at
        try:
            released = await locks._release_on_server(lease, raise_errors=True)
        except asyncio.CancelledError:
            # The caller is cancelled; the hold must still go. A release by the
            # hold's identity is idempotent, so repeating one that may have gone
            # out already is harmless. (Awaited directly, not in a task of its
            # own, to keep the common case to the request's own loop turns;
            # the releaser cannot take the lock straight back from a waiter of
            # another client the release woke: that client has a turn, see the
            # backends.)
            locks._spawn(locks._release_on_server(lease, raise_errors=False))
            raise
        if not released:
            lease._released = False
            lease._lose("the server no longer had this hold at release (expired or taken)")
            raise NotHeld(self.name, "the lease had expired or been taken before release")
        locks._emit("released", self.name, owner, lease.token, held_s=held_s)
        hub = locks._hubs.get(self._shape)
        if hub is not None and hub.waiting(self.name):
            # One event-loop turn before the caller goes on: a waiter this
            # release woke in this process tries first, instead of losing every
            # time to the releasing task's next acquire (which would starve it).
            await asyncio.sleep(0)

    async def __aenter__(self) -> Lease:
        lease = await self.acquire()
        scope = anyio.CancelScope(deadline=lease.expires_at)
        scope.__enter__()
        lease._scopes.append(scope)
        self._scopes.setdefault(lease.owner, []).append((lease, scope))
        return lease

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        owner = current_owner()
        stack = self._scopes[owner]
        lease, scope = stack.pop()
        if not stack:
            del self._scopes[owner]
        lease._scopes.remove(scope)
        if lease._reason is None and not lease._released and asyncio.get_running_loop().time() >= lease.expires_at:
            lease._lose(lease._deadline_reason())  # the watchdog stalled or kept failing
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        if lease.lost:
            reason = lease.lost_reason or "lost"
            if swallowed or exc is None:
                raise LockLost(self.name, reason) from exc
            if exc is not None and not isinstance(exc, LockLost):
                exc.add_note(f"asynclock: the lease on {self.name!r} was lost inside this block: {reason}")
            return False
        if swallowed:
            # Our scope only cancels on loss; keep the contract even if not.
            raise LockLost(self.name, "the trusted deadline passed")
        try:
            await self.release()
        except NotHeld as err:
            if exc is None:
                raise LockLost(self.name, lease.lost_reason or "lost before release") from err
        except BackendUnavailable as err:
            # The body finished; the hold is no longer renewed and expires by itself.
            logger.warning("release of %r failed, it will expire by itself: %r", self.name, err)
            self._locks._spawn(self._locks._release_on_server(lease, raise_errors=False))
        return False

    # -- internal -------------------------------------------------------------

    async def _reenter(self, lease: Lease) -> Lease:
        if lease._reason is None and lease.lost:
            # Past its trusted deadline without the watchdog noticing (it was
            # stalled or not running): lost, not something to build on.
            if self._locks._keeper is not None:
                self._locks._keeper.remove(lease)
            lease._lose(lease._deadline_reason())
        if lease.lost:
            raise LockLost(self.name, lease.lost_reason or "lost")
        lease.hold_count += 1
        try:
            await self._record_count(lease)
        except BaseException:
            lease.hold_count -= 1
            raise
        return lease

    async def _record_count(self, lease: Lease) -> None:
        """Tell the server the new hold count (kept there for ``info`` and tools)."""
        locks = self._locks
        loop = asyncio.get_running_loop()
        give_up = max(lease.expires_at, loop.time() + min(lease._lease_time / 3, _REQUEST_WINDOW))
        delay = _RETRY_FIRST
        while True:
            try:
                async with asyncio.timeout_at(give_up):
                    ok = await lease._backend.set_count(self.name, lease._hold, lease.hold_count, lease._ttl)
                break
            except (LockError, OSError, TimeoutError) as exc:
                if isinstance(exc, ConfigurationError) or loop.time() + delay >= give_up:
                    # The count is informational; the client's count is the truth
                    # and a release at zero removes the hold whatever it says.
                    logger.info("could not record hold count of %r: %r", self.name, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        if not ok:
            if locks._keeper is not None:
                locks._keeper.remove(lease)
            lease._lose("the server no longer has this hold (expired or taken)")
            raise LockLost(self.name, lease.lost_reason or "lost")

    async def _attempt(
        self, hold: str, owner: str, deadline: float | None, keeper: LeaseKeeper
    ) -> Lease | Busy | BaseException:
        """One try. Returns the new Lease, Busy, or the connection error to retry after."""
        locks = self._locks
        backend = self._backend
        loop = asyncio.get_running_loop()
        sent = loop.time()
        lease = Lease(
            name=self.name,
            owner=owner,
            hold=hold,
            ttl=self.ttl,
            lease_time=backend.lease_time(self.ttl),
            sent_at=sent,
            on_lost=locks._lease_lost,
            backend=self._backend,
            shape=self._key[0],
        )
        # Bound each request: by the caller's deadline, and by the lease time
        # (an answer later than that would be useless anyway).
        # Bound each request: by the caller's deadline but never below one
        # request window (so the last try before the deadline can still be
        # answered), and by the lease time (a later answer would be useless).
        bound = sent + lease._lease_time
        if deadline is not None:
            window = min(lease._lease_time / 3, _REQUEST_WINDOW)
            bound = min(bound, max(deadline, sent + window))
        # Awaited directly, not in a task of its own: a try is one request, and
        # the common case stays at that request's own loop turns. Cut short
        # (cancelled, or past its bound), its outcome is unknown: release the
        # hold by its identity, which is harmless if the try got nothing, and
        # retry under a new hold id, so that release can never take a later
        # try's hold.
        try:
            async with asyncio.timeout_at(bound):
                result = await backend.try_acquire(self.name, hold, self.ttl)
        except asyncio.CancelledError:
            # Give back anything it got before the cancellation goes on.
            await _settle(
                locks,
                _discard(locks._release_on_server(lease, raise_errors=False)),
                min(lease._lease_time / 3, _REQUEST_WINDOW),
            )
            raise
        except TimeoutError as exc:
            locks._spawn(locks._release_on_server(lease, raise_errors=False))
            return _HoldRetired(exc)
        except ConfigurationError:
            raise  # no retry can fix it; the try got nothing
        except (LockError, OSError) as exc:
            return exc
        if isinstance(result, Busy):
            return result
        lease.token = result.token
        if locks._closed:
            await _give_back_closed(locks, lease)
        if loop.time() >= lease._expires_at:
            # The answer came too late to be trusted; give it back.
            locks._spawn(locks._release_on_server(lease, raise_errors=False))
            return _HoldRetired(TimeoutError("the answer arrived after the lease time"))
        keeper.add(lease)
        locks._holds.setdefault(self._key, {})[owner] = lease
        return lease

    async def _acquire_queued(
        self, hold: str, owner: str, timeout: float | None, keeper: LeaseKeeper, started: float
    ) -> Lease:
        """Acquire on a backend whose server queues the waiters (ZooKeeper, PostgreSQL)."""
        locks = self._locks
        backend = self._backend
        loop = asyncio.get_running_loop()
        lease = Lease(
            name=self.name,
            owner=owner,
            hold=hold,
            ttl=self.ttl,
            lease_time=backend.lease_time(self.ttl),
            sent_at=loop.time(),
            on_lost=locks._lease_lost,
            backend=self._backend,
            shape=self._key[0],
        )
        if locks._closed:
            raise BackendUnavailable(_CLOSED)
        task = loop.create_task(backend.wait_acquire(self.name, hold, self.ttl, timeout))
        locks._queued.add(task)  # closing the client cancels it
        task.add_done_callback(locks._queued.discard)
        # The backend bounds its own wait; this outer bound only guards against
        # one that does not (a request window of grace past the timeout).
        outer = None if timeout is None else started + timeout + min(lease._lease_time / 3, _REQUEST_WINDOW) + 1.0
        try:
            async with asyncio.timeout_at(outer):
                result = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()  # the backend leaves the queue; if it got the lock anyway, give it back
            await _settle(locks, self._rollback(task, lease), min(lease._lease_time / 3, _REQUEST_WINDOW))
            current = asyncio.current_task()
            if locks._closed and task.cancelled() and current is not None and not current.cancelling():
                # Not our caller's cancellation: the client was closed under the wait.
                locks._emit("timeout", self.name, owner, None, wait_s=loop.time() - started)
                raise BackendUnavailable(_CLOSED) from None
            raise
        except ConfigurationError:
            locks._emit("timeout", self.name, owner, None, wait_s=loop.time() - started)
            raise  # no retry can fix it; the wait got nothing
        except (LockError, OSError, TimeoutError) as exc:
            if not task.done():  # our outer bound fired: leave the queue, time is up
                task.cancel()
                await _settle(locks, self._rollback(task, lease), min(lease._lease_time / 3, _REQUEST_WINDOW))
                self._give_up(hold, owner, Busy(None), timeout, started)
            locks._spawn(locks._release_on_server(lease, raise_errors=False))
            locks._emit("timeout", self.name, owner, None, wait_s=loop.time() - started)
            raise _unavailable(exc) from exc
        if result is None:
            self._give_up(hold, owner, Busy(None), timeout, started)
        lease.token = result.token
        if locks._closed:
            await _give_back_closed(locks, lease)
        lease._acquired_at = loop.time()  # held from the grant, not from joining the queue
        if result.confirmed_at is not None:
            lease._renewed(result.confirmed_at)
        if loop.time() >= lease._expires_at:
            locks._spawn(locks._release_on_server(lease, raise_errors=False))
            raise _unavailable(TimeoutError("the grant arrived after the lease time had passed"))
        keeper.add(lease)
        locks._holds.setdefault(self._key, {})[owner] = lease
        return self._got(lease, started)

    async def _rollback(self, task: asyncio.Task[Acquired | Busy | None], lease: Lease) -> None:
        # Past this time anything the request got has expired on the server.
        give_up = lease._acquired_at + lease._lease_time + lease._ttl
        try:
            async with asyncio.timeout_at(give_up):
                result = await task
        except BaseException as exc:  # the outcome is unknown: release by identity
            task.cancel()
            current = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and current is not None and current.cancelling():
                raise  # this clean-up itself is stopped (the client is closing)
            result = Acquired(None)
        if isinstance(result, Acquired):
            await self._locks._release_on_server(lease, raise_errors=False)

    def _give_up(
        self, hold: str, owner: str, last: Lease | Busy | BaseException, timeout: float | None, started: float
    ) -> NoReturn:
        locks = self._locks
        loop = asyncio.get_running_loop()
        locks._emit("timeout", self.name, owner, None, wait_s=loop.time() - started)
        if isinstance(last, _HoldRetired):
            raise _unavailable(last.__cause__ or last) from last.__cause__
        if isinstance(last, BaseException):
            # An earlier try may have gone through unseen: give it back by identity.
            self._probe_release(hold, owner)
            raise _unavailable(last) from last
        raise LockTimeout(self.name, timeout)

    def _probe_release(self, hold: str, owner: str) -> None:
        """Release ``hold`` in the background, in case a try whose answer was lost got it."""
        locks = self._locks
        probe = Lease(
            name=self.name,
            owner=owner,
            hold=hold,
            ttl=self.ttl,
            lease_time=self._backend.lease_time(self.ttl),
            sent_at=asyncio.get_running_loop().time(),
            on_lost=locks._lease_lost,
            backend=self._backend,
            shape=self._key[0],
        )
        locks._spawn(locks._release_on_server(probe, raise_errors=False))

    def _got(self, lease: Lease, started: float) -> Lease:
        locks = self._locks
        wait = asyncio.get_running_loop().time() - started
        locks._emit("acquired", self.name, lease.owner, lease.token, wait_s=wait)
        return lease


async def _give_back_closed(locks: Locks, lease: Lease) -> NoReturn:
    """An acquire answered after its client was closed: release it (bounded) and refuse."""
    soon = asyncio.get_running_loop().time() + 2 * _REQUEST_WINDOW
    await _shielded(locks, locks._release_on_server(lease, raise_errors=False, give_up=soon))
    raise BackendUnavailable(_CLOSED)


async def _settle(locks: Locks, coro: Coroutine[Any, Any, None], within: float) -> None:
    """Run ``coro`` in its own task and wait for it, through repeated
    cancellations of the caller (anyio delivers a scope's again and again), for
    at most ``within`` seconds; past that it goes on in the background, so a
    cancellation is not held up for the several ttls a clean-up may take."""
    task = locks._spawn(coro)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    while not task.done():
        left = give_up - loop.time()
        if left <= 0:
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=left)


async def _discard(coro: Coroutine[Any, Any, Any]) -> None:
    await coro


async def _shielded(locks: Locks, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in its own task: a cancellation of the caller does not stop it."""
    task = locks._spawn(coro)
    return await asyncio.shield(task)


class Semaphore(Lock):
    """At most ``permits`` holders at once, across every client; made by ``locks.semaphore(name, permits=N)``.

    Used like a :class:`Lock` (``async with sem as lease``, ``acquire``,
    ``release``), and like a lock it belongs to the task that acquired it: the
    same task acquiring again re-enters its own permit rather than taking a
    second one. Each permit has its own lease, fencing token and watchdog, and
    losing it cancels the body that holds it.
    """

    __slots__ = ("permits",)

    def __init__(self, locks: Locks, name: str, ttl: float, permits: int) -> None:
        super().__init__(locks, name, ttl, Shape("semaphore", permits))
        self.permits = permits

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} permits={self.permits} ttl={self.ttl}>"


class WriteLock(Lock):
    """The write side of a :class:`RWLock`: one holder, and no readers meanwhile."""

    __slots__ = ("_read",)

    _read: ReadLock

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} write ttl={self.ttl}>"

    async def acquire(self, *, timeout: float | None = None) -> Lease:
        owner = current_owner()
        holds = self._locks._holds
        if owner not in holds.get(self._key, {}) and owner in holds.get(self._read._key, {}):
            # Waiting for the write side while holding the read side would wait
            # for ourselves (and two tasks doing it would wait for each other).
            raise LockError(
                f"read-write lock {self.name!r}: this task holds the read lock and asked for the write "
                "lock; an upgrade would deadlock. Release the read lock first (or take the write lock "
                "from the start: its holder may also take the read lock)."
            )
        return await super().acquire(timeout=timeout)

    @property
    def held(self) -> bool:
        """Whether the current task holds the write side (not counting reads taken inside it)."""
        return self._holding() and self._writes(current_owner()) > 0

    async def release(self) -> None:
        owner = current_owner()
        if self._holding() and self._writes(owner) <= 0:
            # Only reads taken inside the write remain (a downgrade): those are
            # released through the read side.
            raise NotHeld(self.name, "the write side was released as often as it was acquired")
        await super().release()

    def _writes(self, owner: str) -> int:
        """How many write acquisitions ``owner`` has not released (its hold minus joined reads)."""
        lease = self._locks._holds.get(self._key, {}).get(owner)
        if lease is None:
            return 0
        return lease.hold_count - self._locks._joined.get((self.name, owner), 0)

    async def _release_joined_read(self) -> None:
        await Lock.release(self)


class ReadLock(Lock):
    """The read side of a :class:`RWLock`: any number of holders, while nobody writes.

    The task holding the write side may take the read side too: it then joins
    the write hold (the lock stays exclusive until both are released).
    """

    __slots__ = ("_write",)

    def __init__(self, locks: Locks, name: str, ttl: float, write: WriteLock) -> None:
        super().__init__(locks, name, ttl, Shape("read"))
        self._write = write

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} read ttl={self.ttl}>"

    @property
    def held(self) -> bool:
        """Whether the current task holds the read side (or joined it to its write hold)."""
        if self._locks._joined.get((self.name, current_owner())):
            return self._write._holding()
        return super().held

    async def acquire(self, *, timeout: float | None = None) -> Lease:
        check_timeout(timeout)
        owner = current_owner()
        holds = self._locks._holds
        if owner not in holds.get(self._key, {}):
            writing = holds.get(self._write._key, {}).get(owner)
            if writing is not None:
                lease = await self._write._reenter(writing)
                joined = self._locks._joined
                joined[self.name, owner] = joined.get((self.name, owner), 0) + 1
                return lease
        return await super().acquire(timeout=timeout)

    async def release(self) -> None:
        key = (self.name, current_owner())
        joined = self._locks._joined.get(key)
        if not joined:
            await super().release()
            return
        if joined == 1:
            del self._locks._joined[key]
        else:
            self._locks._joined[key] = joined - 1
        await self._write._release_joined_read()


class RWLock:
    """A read-write lock; made by ``locks.rw_lock(name)``.

    ``rw.read`` and ``rw.write`` are handles that behave like :class:`Lock`
    (``async with``, ``acquire``, ``release``, ``info``, leases with fencing
    tokens, loss → cancellation). Many tasks may hold ``read`` at once;
    ``write`` is held by one task while nobody reads. A writer that waits keeps
    new readers out, so readers cannot starve it.

    Example::

        rw = locks.rw_lock("catalog")
        async with rw.read:
            items = await load()
        async with rw.write as lease:
            await store(items, fencing_token=lease.token)
    """

    __slots__ = ("name", "read", "ttl", "write")

    def __init__(self, locks: Locks, name: str, ttl: float) -> None:
        self.name = name
        self.ttl = ttl
        self.write = WriteLock(locks, name, ttl, Shape("write"))
        self.read = ReadLock(locks, name, ttl, self.write)
        self.write._read = self.read

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} ttl={self.ttl}>"
