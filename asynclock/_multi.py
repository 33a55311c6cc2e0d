"""The multi-lock: several plain locks taken together, all or none, under one lease.

A multi-lock is one ordinary hold of the plain lock of each of its names (so
a single lock of one of those names, of any client, excludes it and is
excluded by it), with a :class:`MultiLease` on top:

* The parts are taken in one canonical order, the names sorted, so two
  multi-locks that share names never wait for each other in a circle. A
  backend that :class:`~asynclock.abc.AcquiresMany` (one Redis server,
  memory://) is first asked for every part in one request, all or none; when
  a part is taken, the parts are taken one at a time, in that order, each
  waiting its turn.
* The timeout bounds the whole; on a timeout, a cancellation or any error
  the parts already taken are given back before the acquire raises.
* A part that ends (lost, or released apart from the multi-lock) ends the
  whole: its body runs under every part, so each part's loss (and the
  keeper's deadline timer of each) cancels it, and the other parts are
  released.
* A part its owner holds already (a single lock of that name, another
  multi-lock) is re-entered, as a lock is: the multi-lock adds one hold
  count to it and takes that one back when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

import anyio

from ._acquire import acquire_all, acquire_new
from ._core import Core
from ._errors import BackendUnavailable, LockError, LockLost, LockTimeout, NotHeld
from ._holdstate import HoldState, now
from ._lease import Lease
from ._lock import Acquiring, AsyncOnly, Lock
from ._owner import current_owner, detached_owner
from ._release import settle
from ._timing import request_window
from ._validate import check_timeout
from ._values import LossReason
from .abc import AcquiresMany, LockRef

__all__ = ["MultiLease", "MultiLock"]

logger = logging.getLogger("asynclock")


class MultiLease:
    """The one lease of a :class:`MultiLock`: every part held, or the whole lost.

    ``tokens`` maps each name to its part's fencing token; ``parts`` maps
    each name to its part's :class:`Lease` (to hand one to a fence, say).
    ``lost`` turns true when any part is lost or released apart from the
    multi-lock; the body is cancelled then and the other parts released.
    ``expires_at`` and ``remaining`` are the earliest part's; ``at_risk`` is
    true while a renewal of any part has failed. ``await lease.release()``
    releases every part, from any task.

    Example::

        async with locks.multi(["acct:1", "acct:2"]) as lease:
            await transfer(fencing_tokens=lease.tokens)
    """

    __slots__ = (
        "_cap",
        "_core",
        "_loss",
        "_lost_event",
        "_lost_part",
        "_parts",
        "_reason",
        "_released",
        "_scopes",
        "hold_count",
        "names",
        "owner",
        "tokens",
    )

    def __init__(self, core: Core, parts: dict[str, Lease], owner: str) -> None:
        self._core = core
        self._parts = parts
        #: The names of the parts, sorted (the order they are taken in).
        self.names: tuple[str, ...] = tuple(parts)
        #: Each part's fencing token (None on a backend without tokens).
        self.tokens: dict[str, int | None] = {name: part.token for name, part in parts.items()}
        self.owner = owner
        #: How many times the owner holds the multi-lock (re-entries); a release at 1 gives it up.
        self.hold_count = 1
        self._reason: str | None = None
        self._loss: LossReason | None = None
        self._lost_part: str | None = None
        self._released = False
        self._lost_event: asyncio.Event | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._cap: asyncio.TimerHandle | None = None
        for part in parts.values():
            part._watch_end(self._part_ended)

    def __repr__(self) -> str:
        state = f"lost: {self._reason}" if self._reason else f"holds={self.hold_count}"
        return f"<MultiLease {list(self.names)!r} tokens={self.tokens} {state}>"

    @property
    def parts(self) -> Mapping[str, Lease]:
        """Each name's part: the :class:`Lease` of its plain lock."""
        return MappingProxyType(self._parts)

    @property
    def expires_at(self) -> float:
        """The earliest trusted deadline of the parts, by the event loop's clock."""
        return min(part._expires_at for part in self._parts.values())

    @property
    def remaining(self) -> float:
        """Seconds left until the earliest part's trusted deadline (0 once lost or released)."""
        if not self._held:
            return 0.0
        return max(0.0, self.expires_at - now())

    @property
    def lost(self) -> bool:
        """True once any part is lost (or released apart from the multi-lock)."""
        if self._reason is not None:
            return True
        if self._released:
            return False
        return any(part.lost or part._released for part in self._parts.values())

    @property
    def lost_reason(self) -> str | None:
        """Why it was lost (which part, and why), or None."""
        if self._reason is None:
            for name, part in self._parts.items():
                if not self._released and part.lost:
                    return f"{name!r}: {part.lost_reason}"
            return None
        return self._reason if self._lost_part is None else f"{self._lost_part!r}: {self._reason}"

    @property
    def at_risk(self) -> bool:
        """True while a renewal of some part has failed and none has succeeded since, and nothing is lost."""
        return not self.lost and any(part.at_risk for part in self._parts.values())

    async def wait_lost(self) -> str:
        """Wait until any part is lost and return why; forever for a lease released without a loss."""
        if self._lost_event is None:
            self._lost_event = asyncio.Event()
        while self._reason is None:
            if self._released:
                await self._lost_event.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self.expires_at):
                    await self._lost_event.wait()
            self._check_deadlines()
        return self.lost_reason or self._reason

    async def wait_at_risk(self) -> str:
        """Wait until a renewal of any part fails (or a part is lost) and return why."""
        waits = [asyncio.ensure_future(self.wait_lost())]
        waits += [asyncio.ensure_future(part.wait_at_risk()) for part in self._parts.values()]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def release(self) -> None:
        """Release every part of this lease, from any task.

        Raises :class:`NotHeld` if it was already released or lost. An
        ``async with`` body of another task that runs under it is cancelled
        and its block raises :class:`LockLost`.
        """
        if not self._held or self.lost:
            raise NotHeld(self.names[0], f"the multi-lock {list(self.names)!r} was already released or lost")
        await self._give_up()

    # -- internal -------------------------------------------------------------

    @property
    def _held(self) -> bool:
        return self._reason is None and not self._released

    def _check_deadlines(self) -> None:
        """Lose the parts whose trusted deadline passed unnoticed (which loses the whole)."""
        for part in self._parts.values():
            part._check_deadline()

    def _loss_of(self) -> tuple[str, str, LossReason]:
        """The part that was lost first, why, and why in a word."""
        if self._reason is None:
            self._check_deadlines()
        if self._reason is None:  # (a part released apart, seen before its watcher ran)
            return self.names[0], self.lost_reason or "lost", LossReason.TAKEN_OR_EXPIRED
        return self._lost_part or self.names[0], self._reason, self._loss or LossReason.TAKEN_OR_EXPIRED

    def _cap_at(self, when: float) -> None:
        """Lose the whole at the loop time ``when`` (the multi-lock's ``max_hold``), unless it ends before."""
        self._cap = asyncio.get_running_loop().call_at(when, self._capped)

    def _capped(self) -> None:
        self._cap = None
        for scope in self._scopes:
            scope.cancel()
        self._end_lost(None, "max_hold", LossReason.MAX_HOLD)

    def _part_ended(self, part: HoldState) -> None:
        """A part was lost, or released apart from the multi-lock: the whole is lost."""
        reason = part._reason or "released apart from the multi-lock"
        self._end_lost(part.name, reason, part._loss or LossReason.TAKEN_OR_EXPIRED)

    def _end_lost(self, name: str | None, reason: str, loss: LossReason) -> None:
        """Lost: release the other parts (unless the client is closing: it releases them)."""
        if not self._held:
            return
        self._reason, self._loss, self._lost_part = reason, loss, name
        if self._lost_event is not None:
            self._lost_event.set()
        # (not the bodies: they run under every part, and the part's end cancels them, as the end
        # of any lease does, sparing only a closing client's own task, whose close it would cut short)
        rest = self._detach()
        core = self._core
        rest = [part for part in rest if part.name != name and part._held]
        if rest and not (core.closed or core.closing):
            for part in _drop(core, rest):
                core.give_back(part)

    def _detach(self) -> list[Lease]:
        """No longer held as a whole: out of the table, no cap, no watch on the parts; the parts."""
        multis = self._core.holds.multis
        key = (self.names, self.owner)
        if multis.get(key) is self:
            del multis[key]
        if self._cap is not None:
            self._cap.cancel()
            self._cap = None
        parts = list(self._parts.values())
        for part in parts:
            part._unwatch_end(self._part_ended)
        return parts

    async def _give_up(self) -> None:
        """Release every part (its share of a part held otherwise too: one hold count)."""
        self._released = True
        parts = self._detach()
        if self._scopes and self.owner != current_owner():
            for scope in self._scopes:
                scope.cancel()  # released from another task: the bodies that held it no longer do
        await _let_go_all(self._core, parts)


async def _let_go_all(core: Core, parts: Sequence[Lease]) -> None:
    """Give up a multi-lock's share of each of ``parts``, together; then raise the first
    failure (NotHeld for a part the server no longer had) once every part is done."""
    results = await asyncio.gather(*(_let_go(core, part) for part in parts), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _let_go(core: Core, part: Lease) -> None:
    """One hold count of ``part`` (re-entered meanwhile), or the whole hold."""
    if part.hold_count > 1:
        part.hold_count -= 1
        await _record_count(core, part)
        return
    try:
        await core.release(part)
    except BackendUnavailable as err:
        # No longer renewed, it expires by itself; given back again in the background meanwhile.
        logger.warning("release of %r failed, it will expire by itself: %r", part.name, err)
        core.give_back(part)
        raise


async def _record_count(core: Core, part: Lease) -> None:
    """Tell the server a part's new hold count, once (informational: the client's count is the
    truth, and a release at zero removes the hold whatever the server counted)."""
    with contextlib.suppress(LockError, OSError, TimeoutError):
        async with asyncio.timeout(request_window(part._lease_time)):
            await core.backend.set_count(part._ref, part._hold, part.hold_count, part._ttl)


def _drop(core: Core, parts: Sequence[Lease]) -> list[Lease]:
    """Give up a multi-lock's share of each of ``parts`` in this client at once: one hold count
    of a part held otherwise too, else the hold (forgotten, no longer renewed). Returns the
    holds given up, for the caller to release on the server."""
    whole: list[Lease] = []
    for part in parts:
        if part.hold_count > 1:
            part.hold_count -= 1
            core.spawn(_record_count(core, part))
        elif part._held:
            if core.keeper is not None:
                core.keeper.remove(part)  # (before the release request: no renewal follows it)
            core.forget(part)
            part._mark_released()
            core.events.emit("released", part.name, part.owner, part.token, held_s=part._held_for())
            whole.append(part)
    return whole


async def _give_back(core: Core, parts: Sequence[Lease]) -> None:
    """An acquire that did not complete: give back what it took, and wait for the server's
    answers (through repeated cancellations of the caller, for a request window)."""
    whole = _drop(core, parts)
    if whole:
        for part in whole:
            core.give_back(part)
        releases = [core.giving_back[part] for part in whole if part in core.giving_back]
        await settle(core.spawn, _wait_all(releases), request_window(whole[0]._lease_time))


async def _wait_all(tasks: list[asyncio.Task[Any]]) -> None:
    if tasks:
        await asyncio.wait(tasks)


class MultiLock(AsyncOnly):
    """Several locks taken together, all or none, under one lease; made by ``locks.multi(names)``.

    Used like a :class:`Lock` (``async with``, ``acquire``, ``release``,
    ``held``): ``acquire`` returns a :class:`MultiLease` once every part is
    held. The parts are the plain locks of the names (``locks.lock(name)``
    excludes a multi-lock that has it, and the other way round), taken in
    one canonical order, the names sorted, so two multi-locks never wait for
    each other in a circle. Repeated names count once. Losing any part loses
    the whole: the body is cancelled, its ``async with`` raises
    :class:`LockLost` (naming the part) and the other parts are released.
    A part the task holds already (``locks.lock(name)``, another multi-lock)
    is re-entered.

    ``acquire(timeout=...)`` bounds the whole wait and raises
    :class:`LockTimeout` (naming the part that was not had in time) holding
    nothing; a cancelled or failed acquire also gives back every part it took.

    Example::

        async with locks.multi(["acct:1", "acct:2"], ttl=10) as lease:
            await transfer(fencing_tokens=lease.tokens)
    """

    __slots__ = ("_core", "_locks", "_scopes", "max_hold", "names", "ttl")
    _noun = "multi"

    def __init__(self, core: Core, names: Sequence[str], ttl: float, max_hold: float | None = None) -> None:
        self._core = core
        #: The names of the parts, sorted (the order they are taken in).
        self.names: tuple[str, ...] = tuple(sorted(set(names)))
        #: The lease time of each part, in seconds.
        self.ttl = ttl
        #: The longest one hold of the whole may last, in seconds (None: no cap).
        self.max_hold = max_hold
        self._locks = [Lock(core, LockRef("lock", name), ttl) for name in self.names]
        self._scopes: dict[str, list[tuple[MultiLease, anyio.CancelScope]]] = {}

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r} ttl={self.ttl}>"

    @property
    def keys(self) -> dict[str, str]:
        """Each part's own name on the backend (Redis key, znode path, advisory key)."""
        return {lock.name: lock.key for lock in self._locks}

    @property
    def held(self) -> bool:
        """Whether the current task holds this multi-lock (every part), as far as this client knows."""
        lease: MultiLease | None = self._core.holds.multis.get((self.names, current_owner()))
        return lease is not None and not lease.lost

    def acquire(self, *, timeout: float | None = None, detached: bool = False) -> Acquiring[MultiLease]:
        """Wait until the current task holds every part: ``lease = await multi.acquire()``, or
        ``async with multi.acquire(timeout=5) as lease:`` (released when the block ends).

        As :meth:`Lock.acquire`: ``timeout`` (None: no limit, 0: one try of
        each part) bounds the whole, :class:`LockTimeout` holding nothing when
        it runs out; ``detached=True`` makes a lease that belongs to no task.
        """
        timeout = check_timeout(timeout)
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be a bool, not {type(detached).__name__}")
        return Acquiring(self, timeout, detached)

    async def _acquire(self, timeout: float | None, detached: bool) -> MultiLease:
        core = self._core
        await core.start()
        owner = detached_owner() if detached else current_owner()
        held: MultiLease | None = None if detached else core.holds.multis.get((self.names, owner))
        if held is not None:
            if held.lost:
                name, reason, loss = held._loss_of()
                raise LockLost(name, reason, loss)
            held.hold_count += 1
            return held
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            try:
                parts = await self._take(owner, deadline, detached)
            except LockTimeout as exc:
                raise LockTimeout(exc.name, timeout) from None  # (the whole's timeout, naming the part)
            if all(part._held and not part._check_deadline() for part in parts.values()):
                break
            # A part was lost while the later ones were being taken: all of them again, in order.
            await _give_back(core, list(parts.values()))
        lease = MultiLease(core, parts, owner)
        if not detached:
            core.holds.multis[self.names, owner] = lease
        if self.max_hold is not None:
            lease._cap_at(loop.time() + self.max_hold)
        return lease

    async def _take(self, owner: str, deadline: float | None, detached: bool) -> dict[str, Lease]:
        """Every part, in order: all at once where the backend can, else one at a time."""
        core = self._core
        holds = core.holds
        parts: dict[str, Lease] = {}
        try:
            fresh = [lock for lock in self._locks if detached or holds.get(lock._key, owner) is None]
            backend = core.backend
            if (
                len(fresh) > 1
                and isinstance(backend, AcquiresMany)
                and backend.acquires_many([lock._key for lock in fresh])
            ):
                got = await acquire_all(core, [lock._want for lock in fresh], owner, deadline)
                if isinstance(got, list):
                    for lease in got:
                        parts[lease.name] = lease
                        if not detached:
                            core.watch_owner(lease)
            loop = asyncio.get_running_loop()
            for lock in self._locks:
                if lock.name in parts:
                    continue
                mine = None if detached else holds.get(lock._key, owner)
                if mine is not None:
                    parts[lock.name] = await lock._reenter(mine)
                    continue
                left = None if deadline is None else max(0.0, deadline - loop.time())
                lease = await acquire_new(core, lock._want, owner, left)
                if not detached:
                    core.watch_owner(lease)
                parts[lock.name] = lease
        except BaseException:
            await _give_back(core, list(parts.values()))
            raise
        return {lock.name: parts[lock.name] for lock in self._locks}

    async def release(self) -> None:
        """Undo one ``acquire`` of the current task; at the last, release every part.

        Raises :class:`NotHeld` if the current task does not hold it (or it was
        lost), and for a part the server no longer had (the others are released).
        """
        core = self._core
        core.check_open()
        lease: MultiLease | None = core.holds.multis.get((self.names, current_owner()))
        if lease is None or lease.lost:
            raise NotHeld(self.names[0], f"the current owner does not hold the multi-lock {list(self.names)!r}")
        if lease.hold_count > 1:
            lease.hold_count -= 1
            return
        await lease._give_up()

    async def __aenter__(self) -> MultiLease:
        lease = await self._acquire(None, False)
        self._enter_body(lease)
        return lease

    def _enter_body(self, lease: MultiLease) -> None:
        """A body starts under ``lease``: it runs under every part, so each part's loss cancels it."""
        scope = anyio.CancelScope()
        scope.__enter__()
        lease._scopes.append(scope)
        keeper = self._core.keeper
        for part in lease._parts.values():
            part._add_body(scope)
            if keeper is not None:
                keeper.guard(part)
        self._scopes.setdefault(lease.owner, []).append((lease, scope))

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        owner = current_owner()
        stack = self._scopes[owner]
        lease, scope = stack.pop()
        if not stack:
            del self._scopes[owner]
        lease._scopes.remove(scope)
        for part in lease._parts.values():
            if scope in part._bodies():
                part._remove_body(scope)
        core = self._core
        if core.body_left is not None:
            core.body_ended()
        if lease._held:
            lease._check_deadlines()  # the watchdog stalled or kept failing
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        if lease._released and not lease.lost:
            if swallowed:
                raise LockLost(lease.names[0], "released by lease.release() in another task") from exc
            return False
        if lease.lost:
            name, reason, loss = lease._loss_of()
            if swallowed or exc is None:
                raise LockLost(name, reason, loss) from exc
            if not isinstance(exc, LockLost):
                exc.add_note(f"asynclock: the multi-lock's part {name!r} was lost inside this block: {reason}")
            return False
        if swallowed:
            raise LockLost(lease.names[0], "the trusted deadline passed")
        try:
            await self.release()
        except NotHeld as err:
            if exc is None:
                raise LockLost(err.name, "lost before release") from err
        except BackendUnavailable:
            pass  # (logged; the parts expire by themselves)
        return False
