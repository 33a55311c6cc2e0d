"""The acquisition engine: how every handle of every backend gets a new hold.

One request at a time, each awaited in the caller's task:

1. A first try (``try_acquire``), at once. ``Acquired``: done, no task and no
   subscription on the way. ``Queued``: wait in the server's queue (step 3).
2. ``Busy`` (a backend that announces releases): subscribe, try again, then
   wait for a release notification or the holder's remaining lease, whichever
   comes first, and try again.
3. ``Queued``: ``wait_queued`` until granted, the caller's deadline, or the
   backend's next poll; at the deadline, leave the queue and time out.

Rules that hold at every step:

* Each request is bounded: by the caller's deadline (never below one request
  window, so the last try can still be answered) and by the lease time.
* A request that fails to reach the server is retried with backoff, for at
  least one request window even with ``timeout=0`` (which means "do not wait
  for the holder", not "do not wait for the server"), and for at most a ttl
  of failures when waiting for ever.
* A request cut short (cancelled, or past its bound) may have gone through:
  the hold is released by its identity, and a retry uses a new hold id, so
  that release can never take a later try's hold.
* A ConfigurationError is raised at once; nothing is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn, cast

from ._core import Core
from ._errors import BackendUnavailable, ConfigurationError, LockError, LockTimeout, server_of, unavailable
from ._lease import Lease
from ._release import give_back_cut_short, release_by_identity, settle
from ._timing import REQUEST_WINDOW, Backoff, request_window
from .abc import Acquired, AcquiresMany, Busy, LockRef, Queued, Queues

__all__ = ["Want", "acquire_all", "acquire_new"]


class _HoldRetired(Exception):
    """An attempt whose hold id is being rolled back: retry under a new id."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.__cause__ = cause


@dataclass(frozen=True, slots=True)
class Want:
    """What a handle's acquires ask for: the request ``ref``, the lock as held for re-entry
    ``key``, the ttl, and the longest one hold may last (None: no cap)."""

    ref: LockRef
    key: LockRef
    ttl: float
    max_hold: float | None = None
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.ref.name)


@dataclass(slots=True)
class _InQueue:
    """A try the server answered by queueing the hold; ``lease`` is the hold's, not yet held."""

    queued: Queued
    lease: Lease


async def acquire_new(core: Core, lock: Want, owner: str, timeout: float | None) -> Lease:
    """A new hold of ``lock`` for ``owner``, within ``timeout`` seconds (None: no limit)."""
    if core.closing or core.closed:
        core.check_accepting()  # raises: no new hold once the client is closing
    backend = core.backend
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = None if timeout is None else started + timeout
    window = request_window(backend.lease_time(lock.ttl))
    server_deadline = None if deadline is None else max(deadline, started + window)
    enqueue = timeout != 0
    hold = core.new_hold(owner)
    hub = core.hub
    assert hub is not None
    notifies = core.notifies
    result: Lease | Busy | _InQueue | BaseException | None = None
    if not (notifies and hub.subscribed(lock.name)):
        # An uncontended acquire is this one request, with no subscription.
        # (When this client already listens for the name, registering first
        # makes the very first try count as "after subscribing".)
        result = await _attempt(core, lock, hold, owner, server_deadline, enqueue)
        if isinstance(result, Lease):
            return _got(core, result, started)
        if isinstance(result, _InQueue):
            return await _wait_in_queue(core, lock, result, owner, deadline, started)
        if isinstance(result, _HoldRetired):
            hold = core.new_hold(owner)
        if isinstance(result, Busy) and deadline is not None and loop.time() >= deadline:
            _give_up(core, lock, hold, owner, result, timeout, started)
    backoff = Backoff()
    # (a first try that got no answer counts towards giving up on the server)
    failing_since: float | None = started if isinstance(result, BaseException) else None
    # the first failure of the current streak: what to report when a server never reached stays away
    first_failure: BaseException | None = result if isinstance(result, BaseException) else None
    last_busy: Busy | None = result if isinstance(result, Busy) else None
    watching = hub.watch(lock.name) if notifies else contextlib.nullcontext(None)
    async with watching as waiter:
        while True:
            if waiter is not None:
                waiter.clear()
            if core.closed or core.closing:
                raise core.closed_error()
            result = await _attempt(core, lock, hold, owner, server_deadline, enqueue)
            if isinstance(result, Lease):
                return _got(core, result, started)
            if isinstance(result, _InQueue):
                return await _wait_in_queue(core, lock, result, owner, deadline, started)
            if isinstance(result, _HoldRetired):
                hold = core.new_hold(owner)
            now = loop.time()
            wait: float | None
            if isinstance(result, Busy):
                last_busy = result
                if deadline is not None and now >= deadline:
                    _give_up(core, lock, hold, owner, result, timeout, started)
                failing_since = first_failure = None
                backoff.reset()
                wait = None if deadline is None else deadline - now
                if result.retry_after is not None:
                    wait = result.retry_after if wait is None else min(wait, result.retry_after)
                if waiter is None and wait is None:
                    wait = window  # no notifications to wait for: look again after a request window
            else:
                # The server did not answer: back off, but never wait
                # forever for a server that stays away.
                failing_since = now if failing_since is None else failing_since
                first_failure = first_failure or result
                # A server never reached (a name not resolved, a refusal) that then merely
                # does not answer (a lookup that stalls) is still one never reached.
                if _unreached(first_failure) and not _answered(result):
                    result = first_failure
                if deadline is not None and now >= deadline and last_busy is not None:
                    # The server answered "taken" before; the time is up. This
                    # try may have gone through unseen: give it back by identity.
                    if not isinstance(result, _HoldRetired):  # (a retired one is rolled back)
                        _probe_release(core, lock, hold, owner)
                    _give_up(core, lock, hold, owner, last_busy, timeout, started)
                if server_deadline is not None and now >= server_deadline:
                    _give_up(core, lock, hold, owner, result, timeout, started)
                # A server that cannot even be connected to is given up on after
                # the connect timeout; one that stopped answering, after a ttl.
                patience = _patience(result, lock.ttl)
                limited = server_deadline is None or patience < lock.ttl
                if limited and now - failing_since >= patience:
                    _give_up(core, lock, hold, owner, result, timeout, started)
                pause = backoff.next()
                wait = min(pause, failing_since + patience - now) if limited else pause
                if server_deadline is not None:
                    wait = min(wait, server_deadline - now)
            if waiter is not None:
                await waiter.wait(wait)
            else:
                await asyncio.sleep(max(wait or 0.0, 0.0))


async def acquire_all(
    core: Core, wants: Sequence[Want], owner: str, deadline: float | None
) -> list[Lease] | Busy | None:
    """New holds of every one of ``wants`` (plain locks of one ttl) for ``owner``, in one
    request to a backend that :class:`AcquiresMany`, all or none.

    Returns the leases (held, in the order of ``wants``), ``Busy`` (one was
    taken: none is held), or None: the request got no answer in time, and
    whatever it may have taken is being given back by identity (the caller
    goes on one lock at a time, under new hold ids).
    """
    if core.closing or core.closed:
        core.check_accepting()
    backend = cast(AcquiresMany, core.backend)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    leases = [_new_lease(core, want, owner, core.new_hold(owner), sent) for want in wants]
    lease_time = leases[0]._lease_time
    bound = sent + lease_time
    if deadline is not None:
        bound = min(bound, max(deadline, sent + request_window(lease_time)))

    def give_back() -> None:
        core.spawn(_release_each(core, leases))

    try:
        with core.deadlines.bound(bound):
            result = await backend.try_acquire_many(
                [want.ref for want in wants], [lease._hold for lease in leases], wants[0].ttl
            )
    except asyncio.CancelledError:
        # It may have gone through: every part is given back by its identity.
        await settle(core.spawn, _release_each(core, leases), request_window(lease_time))
        raise
    except ConfigurationError:
        raise  # no retry can fix it; the try got nothing
    except (LockError, OSError, TimeoutError):
        give_back()
        return None
    if isinstance(result, Busy):
        return result
    if core.closed or core.closing or loop.time() >= leases[0]._expires_at:
        # Answered after the client began closing, or too late to be trusted.
        give_back()
        if core.closed or core.closing:
            raise core.closed_error()
        return None
    for lease, acquired in zip(leases, result, strict=True):
        await _granted(core, lease, acquired, acquired_at=sent)  # (no await inside: the checks passed above)
    return [_got(core, lease, sent) for lease in leases]


async def _release_each(core: Core, leases: Sequence[Lease]) -> None:
    """Release every one of ``leases`` by its identity, together (a try cut short may have taken them)."""
    await asyncio.gather(*(give_back_cut_short(core.backend, lease) for lease in leases))


def _new_lease(core: Core, lock: Want, owner: str, hold: str, sent: float) -> Lease:
    return Lease(
        ref=lock.ref,
        key=lock.key,
        owner=owner,
        hold=hold,
        ttl=lock.ttl,
        lease_time=core.backend.lease_time(lock.ttl),
        sent_at=sent,
        on_lost=core.lease_lost,
        releaser=core.release,
    )


async def _attempt(
    core: Core, lock: Want, hold: str, owner: str, deadline: float | None, enqueue: bool
) -> Lease | Busy | _InQueue | BaseException:
    """One try. Returns the new Lease, Busy, the queued hold, or the connection error to retry after."""
    backend = core.backend
    loop = asyncio.get_running_loop()
    sent = loop.time()
    lease = _new_lease(core, lock, owner, hold, sent)
    # Bound each request by the lease time (a later answer would be useless)
    # and by the caller's deadline, but never below one request window, so
    # that the last try before the deadline can still be answered.
    bound = sent + lease._lease_time
    if deadline is not None:
        bound = min(bound, max(deadline, sent + request_window(lease._lease_time)))
    # Cut short (cancelled, or past its bound), a try's outcome is unknown:
    # release the hold by its identity, which is harmless if the try got
    # nothing, and retry under a new hold id.
    try:
        with core.deadlines.bound(bound):
            result = await backend.try_acquire(lock.ref, hold, lock.ttl, enqueue=enqueue)
    except asyncio.CancelledError:
        await settle(core.spawn, give_back_cut_short(backend, lease), request_window(lease._lease_time))
        raise
    except TimeoutError as exc:
        core.spawn(give_back_cut_short(backend, lease))
        return _HoldRetired(exc)
    except ConfigurationError:
        raise  # no retry can fix it; the try got nothing
    except (LockError, OSError) as exc:
        return exc
    if isinstance(result, Busy):
        return result
    if isinstance(result, Queued):
        return _InQueue(result, lease)
    return await _granted(core, lease, result, acquired_at=sent)


async def _granted(core: Core, lease: Lease, result: Acquired, *, acquired_at: float) -> Lease | _HoldRetired:
    """Hold ``lease`` (the server granted it): from now on the keeper renews it."""
    loop = asyncio.get_running_loop()
    lease.token = result.token
    if core.closed or core.closing:
        await _give_back_closed(core, lease)
    lease._acquired_at = acquired_at
    if result.confirmed_at is not None:
        lease._renewed(result.confirmed_at)
    if loop.time() >= lease._expires_at:
        # The answer came too late to be trusted; give it back.
        core.spawn(release_by_identity(core.backend, lease, raise_errors=False, quiet=True))
        return _HoldRetired(TimeoutError("the answer arrived after the lease time"))
    core.hold(lease)
    return lease


async def _wait_in_queue(
    core: Core, lock: Want, inq: _InQueue, owner: str, deadline: float | None, started: float
) -> Lease:
    """Wait until the queued hold of ``inq`` is granted, or the deadline passes (then leave the queue)."""
    backend = core.backend
    queues = cast(Queues, backend)  # it answered Queued
    lease = inq.lease
    queued = inq.queued
    loop = asyncio.get_running_loop()
    window = request_window(lease._lease_time)
    backoff = Backoff()
    failing_since: float | None = None

    def give_back() -> None:
        core.spawn(give_back_cut_short(backend, lease))

    while True:
        if core.closed or core.closing:
            # (queued by a try answered after the close began): out of the queue
            # before saying so, as a grant answered then is given back
            core.events.emit("timeout", lock.name, owner, None, wait_s=loop.time() - started)
            await _give_back_closed(core, lease)
        until = deadline
        if queued.poll_after is not None:
            poll = loop.time() + queued.poll_after
            until = poll if until is None else min(until, poll)
        wait = core.waiting()
        try:
            with wait:
                result = await queues.wait_queued(lock.ref, lease._hold, lock.ttl, until)
        except asyncio.CancelledError:
            # Out of the queue, and a grant that raced in is given back.
            await settle(core.spawn, give_back_cut_short(backend, lease), window)
            if wait.closed and wait.task.uncancel() == 0:
                core.events.emit("timeout", lock.name, owner, None, wait_s=loop.time() - started)
                raise core.closed_error() from None
            raise
        except (LockError, OSError, TimeoutError) as exc:
            now = loop.time()
            failing_since = now if failing_since is None else failing_since
            final = isinstance(exc, ConfigurationError) or (isinstance(exc, BackendUnavailable) and not exc.retryable)
            gone = now - failing_since >= _patience(exc, lease._lease_time)
            if final or gone or (deadline is not None and now >= deadline):
                # No retry can fix it, or the server stays away (past a lease time of
                # failures the queue entry is gone anyway): give back whatever it may hold.
                give_back()
                core.events.emit("timeout", lock.name, owner, None, wait_s=now - started)
                raise unavailable(exc, server_of(backend)) from exc
            pause = backoff.next()
            await asyncio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
            continue
        except BaseException:
            give_back()
            raise
        failing_since = None
        backoff.reset()
        if isinstance(result, Acquired):
            # Held from the grant, not from joining the queue.
            got = await _granted(core, lease, result, acquired_at=loop.time())
            if isinstance(got, _HoldRetired):
                core.events.emit("timeout", lock.name, owner, None, wait_s=loop.time() - started)
                raise unavailable(TimeoutError("the grant arrived after the lease time had passed"), server_of(backend))
            return _got(core, got, started)
        queued = result
        if deadline is not None and loop.time() >= deadline:
            # Time is up: leave the queue (a grant that raced in is given back, to
            # the next in line) before saying so.
            await settle(core.spawn, release_by_identity(backend, lease, raise_errors=False, quiet=True), window)
            _give_up(core, lock, lease._hold, owner, Busy(None), deadline - started, started)


def _unreached(failure: BaseException) -> bool:
    """No connection to the server could be made at all."""
    return isinstance(failure, BackendUnavailable) and failure.connect_timeout is not None


def _answered(failure: BaseException) -> bool:
    """The server (or its connection) said something: not merely a request without an answer."""
    if isinstance(failure, _HoldRetired):
        return False
    return not isinstance(failure, (TimeoutError, BackendUnavailable))


def _patience(failure: object, longest: float) -> float:
    """How long to keep retrying after ``failure``: the connect timeout of a server
    that cannot be connected to at all, else ``longest``."""
    unreachable = failure.connect_timeout if isinstance(failure, BackendUnavailable) else None
    return longest if unreachable is None else min(longest, unreachable)


def _give_up(
    core: Core,
    lock: Want,
    hold: str,
    owner: str,
    last: Lease | Busy | BaseException,
    timeout: float | None,
    started: float,
) -> NoReturn:
    core.events.emit("timeout", lock.name, owner, None, wait_s=asyncio.get_running_loop().time() - started)
    if isinstance(last, _HoldRetired):
        raise unavailable(last.__cause__ or last, server_of(core.backend)) from last.__cause__
    if isinstance(last, BaseException):
        # An earlier try may have gone through unseen: give it back by identity
        # (not when no connection could be made at all: nothing reached the server).
        if not (isinstance(last, BackendUnavailable) and last.connect_timeout is not None):
            _probe_release(core, lock, hold, owner)
        raise unavailable(last, server_of(core.backend)) from last
    raise LockTimeout(lock.name, timeout)


def _probe_release(core: Core, lock: Want, hold: str, owner: str) -> None:
    """Release ``hold`` in the background, in case a try whose answer was lost got it."""
    probe = _new_lease(core, lock, owner, hold, asyncio.get_running_loop().time())
    core.spawn(give_back_cut_short(core.backend, probe))


def _got(core: Core, lease: Lease, started: float) -> Lease:
    events = core.events
    if events.callback is not None:
        wait = asyncio.get_running_loop().time() - started
        events.emit("acquired", lease.name, lease.owner, lease.token, wait_s=wait)
    return lease


async def _give_back_closed(core: Core, lease: Lease) -> NoReturn:
    """An acquire answered after its client was closed: release it (bounded) and refuse."""
    give_up = asyncio.get_running_loop().time() + 2 * REQUEST_WINDOW
    task = core.spawn(release_by_identity(core.backend, lease, raise_errors=False, give_up=give_up, quiet=True))
    await asyncio.shield(task)
    raise core.closed_error()
