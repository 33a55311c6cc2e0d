"""The handles users hold: Lock, Semaphore, RWLock and its two sides.

A handle is cheap and does no I/O. It keeps what belongs to the owner: re-entry
(the same task acquiring again counts a hold), the ``async with`` cancel
scope, and the read-write rules (a read inside a write joins it, an upgrade is
refused). Getting a new hold is the engine's work (``_acquire``); releasing,
losing and abandoning it the client's (``_client``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio

from ._acquire import Want, acquire_new
from ._core import Core
from ._errors import BackendUnavailable, ConfigurationError, LockError, LockLost, NotHeld, plain, server_of, unavailable
from ._lease import Lease
from ._owner import current_owner, detached_owner
from ._release import release_by_identity
from ._timing import Backoff, request_window
from ._validate import check_timeout
from ._values import LockInfo, LossReason
from .abc import LockRef

__all__ = ["Acquiring", "AsyncOnly", "Entered", "Lock", "RWLock", "ReadLock", "Semaphore", "WriteLock"]

logger = logging.getLogger("asynclock")


class AsyncOnly:
    """What a handle says when it is used as a plain context manager or awaited: how it is used.

    ``_noun``: the word its messages call it (``lock``, ``multi``).
    """

    __slots__ = ()
    _noun = "lock"

    def __enter__(self) -> None:
        raise TypeError(f"{type(self).__name__} is entered with 'async with', not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ always raises
        return None

    def __await__(self) -> Generator[Any, None, Any]:
        noun = self._noun
        raise TypeError(f"a {type(self).__name__} is not awaited: use 'await {noun}.acquire()' or 'async with {noun}'")


class Lock(AsyncOnly):
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
    outlasts the operation raises :class:`BackendUnavailable`, and a server
    that refuses the client's configuration :class:`ConfigurationError`.
    """

    __slots__ = ("_core", "_key", "_ref", "_scopes", "_want", "name")

    def __init__(
        self, core: Core, ref: LockRef, ttl: float, *, key: LockRef | None = None, max_hold: float | None = None
    ) -> None:
        backend = core.backend
        backend.check_kind(ref.kind)  # NotImplementedError before any I/O
        self._core = core
        self._ref = ref
        self.name = ref.name
        if key is None:
            plain = LockRef("lock", ref.name)
            # Where this is the very lock the plain lock of this name is on the
            # server (the fair lock where the plain lock is FIFO already), one
            # hold per task serves both handles, so re-entry works across them.
            same = ref.kind != "lock" and backend.lock_key(ref) == backend.lock_key(plain)
            key = plain if same else ref
        self._key = key
        self._want = Want(ref, key, ttl, max_hold)
        self._scopes: dict[str, list[tuple[Lease, anyio.CancelScope]]] = {}

    def __repr__(self) -> str:
        fair = " fair" if self._ref.kind == "fair" else ""
        return f"<Lock {self.name!r}{fair} ttl={self.ttl}>"

    @property
    def ttl(self) -> float:
        """The lease time of this lock's holds, in seconds."""
        return self._want.ttl

    @property
    def max_hold(self) -> float | None:
        """The longest one hold of this lock may last, in seconds (None: no cap)."""
        return self._want.max_hold

    @property
    def key(self) -> str:
        """The backend's own name for this lock (Redis key, znode path, advisory key)."""
        return self._core.backend.lock_key(self._ref)

    @property
    def held(self) -> bool:
        """Whether the current task holds this lock, as far as this client knows."""
        return self._holding()

    def _holding(self) -> bool:
        lease = self._core.holds.get(self._key, current_owner())
        return lease is not None and not lease.lost

    async def info(self) -> LockInfo:
        """What the server knows: holder, hold count, remaining ttl, waiters, token."""
        await self._core.start()
        backend = self._core.backend
        try:
            async with asyncio.timeout(request_window(backend.lease_time(self.ttl))):
                try:
                    info = await backend.info(self._ref)
                except ConfigurationError:
                    raise
                except (LockError, OSError):
                    info = await backend.info(self._ref)  # read-only: one retry on a fresh connection
        except (LockError, OSError, TimeoutError) as exc:
            raise unavailable(exc, server_of(backend)) from exc
        if info.owner is not None and not info.holders:
            info = dataclasses.replace(info, holders=(info.owner,))
        return info

    def acquire(self, *, timeout: float | None = None, detached: bool = False) -> Acquiring[Lease]:
        """Wait until this task holds the lock: ``lease = await lock.acquire()``, or
        ``async with lock.acquire(timeout=5) as lease:`` (released when the block ends).

        ``timeout=None`` waits forever, ``timeout=0`` tries once. Raises
        :class:`LockTimeout` when the time runs out, :class:`BackendUnavailable`
        when the server could not be reached in that time,
        :class:`ConfigurationError` at once when the server refuses this
        client's configuration. Cancelling the caller never leaves the lock held.
        Bad arguments raise TypeError / ValueError here, before any I/O.

        The hold belongs to the calling task: the same task acquiring again
        re-enters it, and if the task ends while still holding it the hold is
        *abandoned*: released at once, with a WARNING and an ``"abandoned"``
        event. (So do not wrap this call in a task of its own, as
        ``asyncio.wait_for`` does on Python 3.11: use ``timeout=``.)

        Entered with ``async with``, the body runs as under ``async with lock``:
        it is cancelled if the lease is lost (and the block raises
        :class:`LockLost`), and the lock is released when it ends.

        ``detached=True`` makes a lease that belongs to no task: no re-entry,
        kept alive until ``await lease.release()``, its loss, or the client's
        close. It is the way to keep a lock across requests of a web service
        (awaited only: a detached lease outlives blocks).

        Example::

            try:
                async with lock.acquire(timeout=5) as lease:
                    await charge(order, fencing_token=lease.token)
            except asynclock.LockTimeout:
                ...  # somebody else held it for 5 s
        """
        timeout = check_timeout(timeout)
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be a bool, not {type(detached).__name__}")
        return Acquiring(self, timeout, detached)

    async def _acquire(self, timeout: float | None, detached: bool) -> Lease:
        core = self._core
        await core.start()
        want = self._want
        if detached:
            lease = await acquire_new(core, want, detached_owner(), timeout)
        else:
            owner = current_owner()
            held = core.holds.get(self._key, owner)
            if held is not None:
                return await self._reenter(held)
            lease = await acquire_new(core, want, owner, timeout)
            core.watch_owner(lease)
        if want.max_hold is not None:
            core.cap(lease, want.max_hold)
        return lease

    async def release(self) -> None:
        """Undo one ``acquire`` of the current task.

        Raises :class:`NotHeld` if the current task holds nothing (never
        acquired, already released, or the lease was lost), and changes nothing
        on the server then.
        """
        core = self._core
        core.check_open()
        lease = core.holds.get(self._key, current_owner())
        if lease is None or lease.lost:
            raise NotHeld(self.name)
        if lease.hold_count > 1:
            lease.hold_count -= 1
            await self._record_count(lease)
            return
        await core.release(lease)

    async def __aenter__(self) -> Lease:
        lease = await self._acquire(None, False)
        self._enter_body(lease)
        return lease

    def _enter_body(self, lease: Lease) -> None:
        """A body starts under ``lease``: it runs in a cancel scope that the lease's loss cancels."""
        # No deadline of its own: the keeper cancels it when the lease is lost,
        # at its deadline at the latest (a loop timer, while a body runs under it).
        scope = anyio.CancelScope()
        scope.__enter__()
        lease._add_body(scope)
        self._scopes.setdefault(lease.owner, []).append((lease, scope))
        keeper = self._core.keeper
        if keeper is not None:
            keeper.guard(lease)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        owner = current_owner()
        stack = self._scopes[owner]
        lease, scope = stack.pop()
        if not stack:
            del self._scopes[owner]
        lease._remove_body(scope)
        if self._core.body_left is not None:
            self._core.body_ended()  # a drain waits for the bodies to end
        lease._check_deadline()  # the watchdog stalled or kept failing
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        if lease._released and not lease.lost:
            # Released inside the block by ``lease.release()``: by this task (nothing
            # left to do), or by another one, which cancelled this body.
            if swallowed:
                raise LockLost(self.name, "released by lease.release() in another task") from exc
            return False
        if lease.lost:
            reason = lease.lost_reason or "lost"
            if swallowed or exc is None:
                raise LockLost(self.name, reason, lease._loss or LossReason.RENEWAL_FAILED) from exc
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
            # (said once: the retries in the background give up without a word)
            logger.warning("release of %r failed, it will expire by itself: %s", self.name, err)
            core = self._core
            core.spawn(release_by_identity(core.backend, lease, raise_errors=False, quiet=True))
        return False

    # -- internal -------------------------------------------------------------

    async def _reenter(self, lease: Lease) -> Lease:
        # Past its trusted deadline without the watchdog noticing (it was
        # stalled or not running): lost, not something to build on.
        if lease._check_deadline() or lease.lost:
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
        backend = self._core.backend
        loop = asyncio.get_running_loop()
        give_up = max(lease.expires_at, loop.time() + request_window(lease._lease_time))
        backoff = Backoff()
        while True:
            try:
                async with asyncio.timeout_at(give_up):
                    ok = await backend.set_count(lease._ref, lease._hold, lease.hold_count, lease._ttl)
                break
            except (LockError, OSError, TimeoutError) as exc:
                pause = backoff.next()
                if isinstance(exc, ConfigurationError) or loop.time() + pause >= give_up:
                    # The count is informational; the client's count is the truth
                    # and a release at zero removes the hold whatever it says.
                    logger.info("could not record hold count of %r: %s", self.name, plain(exc))
                    return
                await asyncio.sleep(pause)
        if not ok:
            lease._lose("the server no longer has this hold (expired or taken)", LossReason.TAKEN_OR_EXPIRED)
            raise LockLost(self.name, lease.lost_reason or "lost")


L = TypeVar("L")


class Entered(Protocol[L]):
    """A handle whose ``acquire()`` returns an :class:`Acquiring`: how it acquires, and runs a body."""

    async def _acquire(self, timeout: float | None, detached: bool) -> L: ...

    def _enter_body(self, lease: L) -> None: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool: ...


class Acquiring(Coroutine[Any, Any, L]):
    """What :meth:`Lock.acquire` returns: awaited, the lease; entered with ``async with``, a held block.

    ``lease = await lock.acquire(timeout=5)`` waits for the lock and returns
    the :class:`Lease` (released with ``await lock.release()``);
    ``async with lock.acquire(timeout=5) as lease:`` waits the same way, runs
    the block under the lease (cancelled if it is lost, :class:`LockLost`
    raised then) and releases the lock when the block ends.
    """

    __slots__ = ("_coro", "_detached", "_lock", "_timeout")

    def __init__(self, lock: Entered[L], timeout: float | None, detached: bool) -> None:
        self._lock = lock
        self._timeout = timeout
        self._detached = detached
        self._coro: Coroutine[Any, Any, L] | None = None

    # A coroutine as well, so that asyncio.create_task(lock.acquire()) works as it always has.

    def _acquiring(self) -> Coroutine[Any, Any, L]:
        if self._coro is None:
            self._coro = self._lock._acquire(self._timeout, self._detached)
        return self._coro

    def __await__(self) -> Generator[Any, None, L]:
        coro = self._coro
        if coro is None:
            coro = self._coro = self._lock._acquire(self._timeout, self._detached)
        return coro.__await__()

    def send(self, value: Any) -> Any:
        return self._acquiring().send(value)

    def throw(self, *args: Any) -> Any:
        return self._acquiring().throw(*args)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    async def __aenter__(self) -> L:
        lock = self._lock
        if self._detached:
            raise TypeError(
                "a detached lease belongs to no block: 'lease = await lock.acquire(detached=True)',"
                " then 'await lease.release()'"
            )
        lease = await lock._acquire(self._timeout, False)
        lock._enter_body(lease)
        return lease

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return await self._lock.__aexit__(exc_type, exc, tb)


class Semaphore(Lock):
    """At most ``permits`` holders at once, across every client; made by ``locks.semaphore(name, permits=N)``.

    Used like a :class:`Lock` (``async with sem as lease``, ``acquire``,
    ``release``), and like a lock it belongs to the task that acquired it: the
    same task acquiring again re-enters its own permit rather than taking a
    second one. Each permit has its own lease, fencing token and watchdog, and
    losing it cancels the body that holds it.
    """

    __slots__ = ("permits",)

    def __init__(self, core: Core, name: str, ttl: float, permits: int, max_hold: float | None = None) -> None:
        super().__init__(core, LockRef("semaphore", name, permits), ttl, max_hold=max_hold)
        self.permits = permits

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} permits={self.permits} ttl={self.ttl}>"


class WriteLock(Lock):
    """The write side of a :class:`RWLock`: one holder, and no readers meanwhile."""

    __slots__ = ("_read",)

    _read: ReadLock

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} write ttl={self.ttl}>"

    async def _acquire(self, timeout: float | None, detached: bool) -> Lease:
        owner = current_owner()
        holds = self._core.holds
        if not detached and holds.get(self._key, owner) is None and holds.get(self._read._key, owner) is not None:
            # Waiting for the write side while holding the read side would wait
            # for ourselves (and two tasks doing it would wait for each other).
            raise LockError(
                f"read-write lock {self.name!r}: this task holds the read lock and asked for the write "
                "lock; an upgrade would deadlock. Release the read lock first (or take the write lock "
                "from the start: its holder may also take the read lock)."
            )
        return await super()._acquire(timeout, detached)

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
        lease = self._core.holds.get(self._key, owner)
        if lease is None:
            return 0
        return lease.hold_count - self._core.holds.joined(self.name, owner)

    async def _release_joined_read(self) -> None:
        await Lock.release(self)


class ReadLock(Lock):
    """The read side of a :class:`RWLock`: any number of holders, while nobody writes.

    The task holding the write side may take the read side too: it then joins
    the write hold (the lock stays exclusive until both are released).
    """

    __slots__ = ("_write",)

    def __init__(self, core: Core, name: str, ttl: float, write: WriteLock, max_hold: float | None = None) -> None:
        super().__init__(core, LockRef("read", name), ttl, max_hold=max_hold)
        self._write = write

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} read ttl={self.ttl}>"

    @property
    def held(self) -> bool:
        """Whether the current task holds the read side (or joined it to its write hold)."""
        if self._core.holds.joined(self.name, current_owner()):
            return self._write._holding()
        return super().held

    async def _acquire(self, timeout: float | None, detached: bool) -> Lease:
        owner = current_owner()
        holds = self._core.holds
        if not detached and holds.get(self._key, owner) is None:
            writing = holds.get(self._write._key, owner)
            if writing is not None:
                lease = await self._write._reenter(writing)
                holds.join(self.name, owner)
                return lease
        return await super()._acquire(timeout, detached)

    async def release(self) -> None:
        owner = current_owner()
        holds = self._core.holds
        if not holds.joined(self.name, owner):
            await super().release()
            return
        holds.unjoin(self.name, owner)
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

    def __init__(self, core: Core, name: str, ttl: float, max_hold: float | None = None) -> None:
        self.name = name
        self.ttl = ttl
        self.write = WriteLock(core, LockRef("write", name), ttl, max_hold=max_hold)
        self.read = ReadLock(core, name, ttl, self.write, max_hold)
        self.write._read = self.read

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r} ttl={self.ttl}>"
