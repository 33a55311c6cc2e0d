"""LeaseKeeper: the one watchdog task of a client.

It sleeps until the earliest lease is due (ttl/3 after the send time of its
last successful acquire or renewal), renews every lease that is due or nearly
due in one backend call per primitive (the backend batches it into as few
round trips as it can), and moves each lease's trusted deadline to
``send time + lease time - drift``. A renewal answered "not the holder" loses
the lease at once; an error is retried with backoff until the lease's own
deadline, and then the lease is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._errors import LockError
from ._values import LossReason
from .abc import RenewItem

if TYPE_CHECKING:
    from ._lease import Lease
    from .abc import Backend

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("asynclock")


class LeaseKeeper:
    """Renews every lease of one client from a single task."""

    def __init__(self, backend: Backend, on_renewed: Callable[[Lease], None]) -> None:
        self._backend = backend
        self._on_renewed = on_renewed
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, int, Lease]] = []
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # renewal calls under way, one per primitive and batch: the loop does not wait
        # for them, so one primitive's slow call never holds up another's leases
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

    def lose(self, holds: list[str] | None, reason: str, loss: LossReason) -> None:
        """Lose the given holds (None: all) at once, as a backend reported."""
        targets = (
            list(self._leases.values()) if holds is None else [self._leases[h] for h in holds if h in self._leases]
        )
        for lease in targets:
            self._drop_lost(lease, reason, loss)

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
            # Drop entries of released or rescheduled leases once they are due,
            # not earlier: a heap emptied of them would wake this task at the
            # very next acquire of a client that acquires and releases in turn.
            # ``_push`` rebuilds the heap when they pile up.
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
        """Start one renewal call per primitive for ``batch``; each applies its own results."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        groups: dict[str, list[Lease]] = {}
        for lease in batch:
            if sent >= lease._expires_at:
                self._drop_lost(
                    lease, "the trusted deadline passed before the lease could be renewed", LossReason.RENEWAL_FAILED
                )
            else:
                groups.setdefault(lease._ref.kind, []).append(lease)
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
                self._drop_lost(
                    lease, "the server no longer has this hold (expired or taken)", LossReason.TAKEN_OR_EXPIRED
                )
            elif now >= lease._expires_at:
                self._drop_lost(
                    lease, f"could not renew before the trusted deadline: {result}", LossReason.RENEWAL_FAILED
                )
            else:
                logger.info("renewal of %r failed, retrying: %r", lease.name, result)
                lease._last_error = str(result) or repr(result)
                lease._next_due = min(now + lease._backoff, lease._expires_at)
                lease._backoff = min(lease._backoff * 2, lease._ttl / 6)
                self._push(lease)

    async def _renew_group(self, group: list[Lease], bound: float) -> tuple[list[bool | BaseException], bool]:
        """One renew call for ``group``, bounded by ``bound``: (results, whether the bound fired)."""
        items = [RenewItem(lease._ref, lease._hold, lease._ttl) for lease in group]
        self.round_trips += 1
        timer = asyncio.timeout_at(bound)
        try:
            async with timer:
                return list(await self._backend.renew(items)), False
        except (LockError, OSError, TimeoutError) as exc:
            return [exc] * len(group), timer.expired()
        except Exception as exc:  # a backend bug must not kill the one watchdog of every lease
            logger.exception("renew call of %s failed unexpectedly", type(self._backend).__name__)
            return [exc] * len(group), False

    def _drop_lost(self, lease: Lease, reason: str, loss: LossReason) -> None:
        self._leases.pop(lease._hold, None)
        lease._lose(reason, loss)
