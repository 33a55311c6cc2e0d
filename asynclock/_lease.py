"""Lease (what a holder gets) and LeaseKeeper (the one watchdog task per client).

The keeper sleeps until the earliest lease is due (ttl/3 after the send time
of its last successful acquire or renewal), renews every lease that is due or
nearly due in one backend call (the backend batches it into as few round trips
as it can), and moves each lease's trusted deadline to
``send time + lease time - drift``. A renewal answered "not the holder" loses
the lease at once; an error is retried with backoff until the lease's own
deadline, and then the lease is lost. Losing a lease cancels every
``async with`` body that runs under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._errors import LockError
from .abc import RenewItem

if TYPE_CHECKING:
    import anyio

    from .abc import Backend, Shape

logger = logging.getLogger("asynclock")

#: Smallest retry delay after a failed renewal, in seconds.
_MIN_BACKOFF = 0.02


def drift(ttl: float) -> float:
    """Clock drift allowance for a lease of ``ttl`` seconds: 1 % plus 2 ms."""
    return ttl * 0.01 + 0.002


class Lease:
    """A hold on a lock, returned by ``acquire`` and ``async with``.

    ``token`` is the fencing token: pass it to the resource you protect so that
    a holder whose lease was lost cannot write after the next holder did.
    ``expires_at`` is the ``time.monotonic()`` deadline this client trusts;
    the watchdog keeps moving it forward while the lease is renewed.
    ``lost`` turns true when the lease is lost; ``await lease.wait_lost()``
    returns then. Re-entering the lock returns the same Lease with a higher
    ``hold_count``. ``await lease.release()`` releases it (every hold) from
    any task, e.g. a request handler other than the one that acquired it.

    Example::

        lease = await lock.acquire()
        try:
            await write(data, fencing_token=lease.token)
        finally:
            await lock.release()
    """

    __slots__ = (
        "_acquired_at",
        "_backend",
        "_backoff",
        "_expires_at",
        "_hold",
        "_last_error",
        "_lease_time",
        "_lost_event",
        "_next_due",
        "_on_lost",
        "_owner_done",
        "_owner_task",
        "_reason",
        "_released",
        "_releaser",
        "_scopes",
        "_shape",
        "_ttl",
        "hold_count",
        "name",
        "owner",
        "token",
    )

    def __init__(
        self,
        *,
        name: str,
        owner: str,
        hold: str,
        ttl: float,
        lease_time: float,
        sent_at: float,
        on_lost: Callable[[Lease, str], None],
        backend: Backend,
        shape: Shape,
        releaser: Callable[[Lease], Awaitable[None]],
    ) -> None:
        self.name = name
        self.owner = owner
        self.token: int | None = None
        self.hold_count = 1
        self._hold = hold
        self._ttl = ttl
        self._lease_time = lease_time
        self._expires_at = sent_at + lease_time - drift(ttl)
        self._next_due = sent_at + ttl / 3
        self._acquired_at = sent_at
        self._backoff = _MIN_BACKOFF
        self._reason: str | None = None
        self._last_error: str | None = None
        self._released = False
        self._lost_event: asyncio.Event | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._on_lost = on_lost
        self._backend = backend  # the adapter of the primitive this lease holds
        self._shape = shape
        self._releaser = releaser
        # The task that owns the hold, while it is watched for ending still holding it.
        self._owner_task: asyncio.Task[Any] | None = None
        self._owner_done: Callable[[asyncio.Task[Any]], None] | None = None

    def __repr__(self) -> str:
        state = f"lost: {self._reason}" if self._reason else f"holds={self.hold_count}"
        return f"<Lease {self.name!r} token={self.token} {state}>"

    @property
    def expires_at(self) -> float:
        """Monotonic time until which this client trusts the lease."""
        return self._expires_at

    @property
    def lost(self) -> bool:
        """True once the lease is lost (taken, expired, or not renewed in time)."""
        if self._reason is not None:
            return True
        if self._released:
            return False
        return _now() >= self._expires_at

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, or None."""
        if self._reason is None and self.lost:
            return self._deadline_reason()
        return self._reason

    def _deadline_reason(self) -> str:
        reason = "the trusted deadline passed without a renewal"
        if self._last_error is not None:
            reason += f" (last renewal error: {self._last_error})"
        return reason

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
            if self._reason is None and _now() >= self._expires_at:
                self._lose(self._deadline_reason())
        return self._reason

    async def release(self) -> None:
        """Release this lease, every hold of it, from any task.

        Raises :class:`NotHeld` if it was already released or lost. An
        ``async with`` body of another task that runs under this lease is
        cancelled and its block raises :class:`LockLost`.
        """
        await self._releaser(self)

    # -- internal -------------------------------------------------------------

    def _renewed(self, sent_at: float) -> None:
        self._expires_at = sent_at + self._lease_time - drift(self._ttl)
        self._next_due = sent_at + self._ttl / 3
        self._backoff = _MIN_BACKOFF
        self._last_error = None
        for scope in self._scopes:
            scope.deadline = self._expires_at

    def _lose(self, reason: str) -> None:
        if self._reason is not None or self._released:
            return
        self._reason = reason
        if self._lost_event is not None:
            self._lost_event.set()
        for scope in self._scopes:
            scope.cancel()
        self._on_lost(self, reason)


def _now() -> float:
    return asyncio.get_running_loop().time()


class LeaseKeeper:
    """Renews every lease of one client from a single task."""

    def __init__(self, on_renewed: Callable[[Lease], None]) -> None:
        self._on_renewed = on_renewed
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, int, Lease]] = []
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # renewal calls under way, one per adapter and batch: the loop does not wait
        # for them, so one adapter's slow call never holds up another's leases
        self._inflight: set[asyncio.Task[None]] = set()
        self.round_trips = 0  # renew calls made; read by tests and benchmarks

    def __len__(self) -> int:
        return len(self._leases)

    def add(self, lease: Lease) -> None:
        """Start renewing ``lease``; call right after the acquire answer, with no await between."""
        self._leases[lease._hold] = lease
        self._push(lease)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-lease-keeper")

    def remove(self, lease: Lease) -> None:
        """Stop renewing ``lease``; call before its release request is sent."""
        self._leases.pop(lease._hold, None)

    def holds(self) -> list[Lease]:
        return list(self._leases.values())

    def lose(self, holds: list[str] | None, reason: str) -> None:
        """Lose the given holds (None: all) at once, as a backend reported."""
        targets = (
            list(self._leases.values()) if holds is None else [self._leases[h] for h in holds if h in self._leases]
        )
        for lease in targets:
            self._leases.pop(lease._hold, None)
            lease._lose(reason)

    async def aclose(self) -> None:
        tasks = [*self._inflight, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    def _push(self, lease: Lease) -> None:
        first = self._heap[0][0] if self._heap else None
        if len(self._heap) > 2 * len(self._leases) + 64:
            self._heap = [entry for entry in self._heap if not self._stale(entry)]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (lease._next_due, next(self._seq), lease))
        if first is None or lease._next_due < first:
            self._changed.set()

    def _stale(self, entry: tuple[float, int, Lease]) -> bool:
        """Whether a heap entry belongs to a lease released, lost or rescheduled since."""
        lease = entry[2]
        return lease._hold not in self._leases or lease._next_due != entry[0]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            heap = self._heap
            now = loop.time()
            # Drop entries of released or rescheduled leases once they are due.
            # (Not earlier: a heap emptied of them would make the very next
            # acquire wake this task, once per acquire of a client that
            # acquires and releases in turn. ``_push`` rebuilds the heap when
            # they pile up.)
            while heap and heap[0][0] <= now and self._stale(heap[0]):
                heapq.heappop(heap)
            if not heap:
                self._changed.clear()
                await self._changed.wait()
                continue
            due = heap[0][0]
            if due > now:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(due):
                        await self._changed.wait()
                continue
            # Renew everything due now or within the next sixth of a period:
            # leases acquired close together share one round trip.
            now = loop.time()
            batch: list[Lease] = []
            while heap:
                when, _, lease = heap[0]
                if lease._hold not in self._leases or lease._next_due != when:
                    heapq.heappop(heap)
                    continue
                if when > now + lease._ttl / 6:
                    break
                heapq.heappop(heap)
                batch.append(lease)
            if batch:
                self._renew(batch)
                await asyncio.sleep(0)  # let the calls go out before looking at the heap again

    def _renew(self, batch: list[Lease]) -> None:
        """Start one renewal call per adapter for ``batch``; each applies its own results."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        groups: dict[int, list[Lease]] = {}
        for lease in batch:
            if sent >= lease._expires_at:
                self._drop_lost(lease, "the trusted deadline passed before the lease could be renewed")
            else:
                groups.setdefault(id(lease._backend), []).append(lease)
        for group in groups.values():
            task = loop.create_task(self._renew_and_apply(group, sent))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _renew_and_apply(self, group: list[Lease], sent: float) -> None:
        loop = asyncio.get_running_loop()
        earliest = min(lease._expires_at for lease in group)
        if len(group) == 1:
            results, expired = await self._renew_group(group, earliest)
        else:
            # A call for several holds gets half the time left: if one hold's
            # renewal hangs (one stuck connection among a backend's many), the
            # others are tried again apart, in halves, before their deadlines.
            results, expired = await self._renew_group(group, sent + (earliest - sent) / 2)
            if expired:
                now = loop.time()
                middle = len(group) // 2
                live = [lease for lease in group if lease._hold in self._leases]
                await asyncio.gather(
                    *(self._renew_and_apply(half, now) for half in (live[:middle], live[middle:]) if half)
                )
                return
        now = loop.time()
        for lease, result in zip(group, results, strict=True):
            if lease._hold not in self._leases:
                continue  # released while the renewal was in flight
            if result is True:
                lease._renewed(sent)
                self._push(lease)
                logger.debug("renewed %r until %.3f", lease.name, lease._expires_at)
                self._on_renewed(lease)
            elif result is False:
                self._drop_lost(lease, "the server no longer has this hold (expired or taken)")
            elif now >= lease._expires_at:
                self._drop_lost(lease, f"could not renew before the trusted deadline: {result}")
            else:
                logger.info("renewal of %r failed, retrying: %r", lease.name, result)
                lease._last_error = str(result) or repr(result)
                lease._next_due = min(now + lease._backoff, lease._expires_at)
                lease._backoff = min(lease._backoff * 2, lease._ttl / 6)
                self._push(lease)

    async def _renew_group(self, group: list[Lease], bound: float) -> tuple[list[bool | BaseException], bool]:
        """One renew call for ``group``, bounded by ``bound``: (results, whether the bound fired)."""
        backend = group[0]._backend
        items = [RenewItem(lease.name, lease._hold, lease._ttl) for lease in group]
        self.round_trips += 1
        timer = asyncio.timeout_at(bound)
        try:
            async with timer:
                return list(await backend.renew(items)), False
        except (LockError, OSError, TimeoutError) as exc:
            return [exc] * len(group), timer.expired()
        except Exception as exc:  # a backend bug must not kill the one watchdog of every lease
            logger.exception("renew call of %s failed unexpectedly", type(backend).__name__)
            return [exc] * len(group), False

    def _drop_lost(self, lease: Lease, reason: str) -> None:
        self._leases.pop(lease._hold, None)
        lease._lose(reason)
