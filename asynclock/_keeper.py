"""LeaseKeeper: the one watchdog of a client.

Leases are kept in *cohorts*: the leases one renewal call renewed share its
send time, so they share the time they are due again (ttl/3 later) and their
trusted deadline (``send time + lease time - drift``). A cohort is one heap
entry and at most one loop timer, whatever its size:

* One task sleeps until the earliest cohort is due, then renews every lease
  due now or within the next sixth of a period, in one backend call per
  primitive (the backend batches it into as few round trips as it can). A
  renewal answered "not the holder" loses the lease at once; an error, or no
  answer within half the time left, puts the lease *at risk* (an event, and
  ``lease.wait_at_risk()`` returns) and is retried with backoff until the
  lease's own deadline.
* A cohort with a lease that an ``async with`` body runs under has a timer
  at its deadline, which loses every lease of it not renewed since (and so
  cancels those bodies). It is a loop callback: it fires even when a renewal
  hangs or the watchdog is gone, so a body never outlives its lease and needs
  no timer of its own. A lease held without a body needs none: ``lost`` and
  ``wait_lost()`` read the deadline themselves, and the task drops it when
  it comes due.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._errors import LockError, plain
from ._values import LossReason

if TYPE_CHECKING:
    from ._lease import Lease
    from .abc import Backend

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("asynclock")

_DEADLINE = "the trusted deadline passed before the lease could be renewed"


class _Cohort:
    """Leases due at one time, with one deadline (and, while a body runs under one of them, a timer for it)."""

    __slots__ = ("due", "expires_at", "leases", "live", "timer")

    def __init__(self, due: float, expires_at: float, leases: list[Lease]) -> None:
        self.due = due
        self.expires_at = expires_at
        self.leases = leases
        self.live = len(leases)  # leases held whose cohort this is
        self.timer: asyncio.TimerHandle | None = None


class LeaseKeeper:
    """Renews every lease of one client from a single task, and enforces their deadlines."""

    def __init__(
        self,
        backend: Backend,
        on_renewed: Callable[[Lease], None] | None,
        on_at_risk: Callable[[Lease, str], None],
    ) -> None:
        self._backend = backend
        self._on_renewed = on_renewed
        self._on_at_risk = on_at_risk
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, int, _Cohort]] = []
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
        self._schedule([lease], lease._next_due, lease._expires_at)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynclock-lease-keeper")

    def guard(self, lease: Lease) -> None:
        """A body runs under ``lease`` now: make sure it is lost, and the body cancelled, at its deadline."""
        cohort = lease._cohort
        if cohort is not None and cohort.timer is None and self._leases.get(lease._hold) is lease:
            self._arm(cohort)

    def remove(self, lease: Lease) -> None:
        """Stop renewing ``lease``; call before its release request is sent."""
        if self._leases.pop(lease._hold, None) is lease:
            self._leave(lease)

    def holds(self) -> list[Lease]:
        return list(self._leases.values())

    def at_risk(self, holds: list[str] | None, reason: str) -> None:
        """The given holds (None: all) may be lost soon, as a backend reported (a session disconnected)."""
        targets = (
            list(self._leases.values()) if holds is None else [self._leases[h] for h in holds if h in self._leases]
        )
        for lease in targets:
            if lease._mark_at_risk(reason):
                self._on_at_risk(lease, reason)

    def lose(self, holds: list[str] | None, reason: str, loss: LossReason) -> None:
        """Lose the given holds (None: all) at once, as a backend reported."""
        targets = (
            list(self._leases.values()) if holds is None else [self._leases[h] for h in holds if h in self._leases]
        )
        for lease in targets:
            self._drop_lost(lease, reason, loss)

    async def aclose(self) -> None:
        """Stop renewing. A lease nobody renews any more is still lost at its deadline, with its bodies."""
        for _, _, cohort in self._heap:
            if cohort.timer is None and any(lease._bodies() and self._mine(cohort, lease) for lease in cohort.leases):
                self._arm(cohort)
        tasks = [*self._inflight, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    # -- cohorts --------------------------------------------------------------------

    def _schedule(self, leases: list[Lease], due: float, expires_at: float, guarded: bool = False) -> None:
        """Renew ``leases`` at ``due`` (with a deadline timer at ``expires_at`` if ``guarded``)."""
        cohort = _Cohort(due, expires_at, leases)
        for lease in leases:
            lease._cohort = cohort
        if guarded:
            self._arm(cohort)
        heap = self._heap
        first = heap[0][0] if heap else None
        if len(heap) > 2 * len(self._leases) + 64:
            self._heap = heap = [entry for entry in heap if self._live(entry[2])]
            heapq.heapify(heap)
        heapq.heappush(heap, (due, next(self._seq), cohort))
        if first is None or due < first:
            self._changed.set()

    def _live(self, cohort: _Cohort) -> bool:
        """Whether a cohort still has a lease held and not moved to another cohort since."""
        return cohort.live > 0

    def _mine(self, cohort: _Cohort, lease: Lease) -> bool:
        return lease._cohort is cohort and self._leases.get(lease._hold) is lease

    def _arm(self, cohort: _Cohort) -> None:
        cohort.timer = asyncio.get_running_loop().call_at(cohort.expires_at, self._deadline, cohort)

    def _leave(self, lease: Lease) -> None:
        """``lease`` leaves its cohort (released, lost, or moved to a new one)."""
        cohort = lease._cohort
        if cohort is None:
            return
        lease._cohort = None
        cohort.live -= 1
        if cohort.live == 0:
            self._retire(cohort)

    def _deadline(self, cohort: _Cohort) -> None:
        """A cohort's deadline: lose its leases that were not renewed since (renewed ones moved on)."""
        cohort.timer = None
        now = asyncio.get_running_loop().time()
        for lease in cohort.leases:
            if self._mine(cohort, lease) and lease._expires_at <= now:
                self._drop_lost(lease, lease._deadline_reason(), LossReason.RENEWAL_FAILED)

    def _retire(self, cohort: _Cohort) -> None:
        """No lease is left in ``cohort``: its timer is not needed."""
        if cohort.timer is not None:
            cohort.timer.cancel()
            cohort.timer = None

    # -- the task ---------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            heap = self._heap
            now = loop.time()
            # Drop cohorts whose leases were all released or rescheduled once they
            # are due, not earlier: a heap emptied of them would wake this task at
            # the very next acquire of a client that acquires and releases in turn.
            # ``_schedule`` rebuilds the heap when they pile up.
            while heap and heap[0][0] <= now and not self._live(heap[0][2]):
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
                when, _, cohort = heap[0]
                mine = [lease for lease in cohort.leases if self._mine(cohort, lease)]
                if mine and when > now + min(lease._ttl for lease in mine) / 6:
                    break
                heapq.heappop(heap)
                batch += mine
            if batch:
                self._renew(batch)
                await asyncio.sleep(0)  # let the calls go out before looking at the heap again

    def _renew(self, batch: list[Lease]) -> None:
        """Start one renewal call per primitive for ``batch``; each applies its own results.

        The leases stay in their cohorts (and under their timers) until their results come.
        """
        loop = asyncio.get_running_loop()
        sent = loop.time()
        groups: dict[str, list[Lease]] = {}
        for lease in batch:
            if sent >= lease._expires_at:
                self._drop_lost(lease, _DEADLINE, LossReason.RENEWAL_FAILED)
            else:
                groups.setdefault(lease._ref.kind, []).append(lease)
        for group in groups.values():
            task = loop.create_task(self._renew_and_apply(group, sent))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _renew_and_apply(self, group: list[Lease], sent: float) -> None:
        loop = asyncio.get_running_loop()
        earliest = min(lease._expires_at for lease in group)
        half = sent + (earliest - sent) / 2
        if len(group) == 1:
            # One hold: its request may take until the deadline (cutting a slow
            # answer short would only cost a reconnect); unanswered by half the
            # time left, the lease is at risk meanwhile.
            warning = loop.call_at(half, self._unanswered, group)
            try:
                results, _ = await self._renew_group(group, earliest)
            finally:
                warning.cancel()
        else:
            # Several holds get half the time left: if one hold's renewal hangs
            # (one stuck connection among a backend's many), the others are at
            # risk and are tried again apart, in halves, before their deadlines.
            results, expired = await self._renew_group(group, half)
            if expired:
                now = loop.time()
                live = [lease for lease in group if self._leases.get(lease._hold) is lease]
                self._unanswered(live)
                middle = len(live) // 2
                await asyncio.gather(
                    *(self._renew_and_apply(part, now) for part in (live[:middle], live[middle:]) if part)
                )
                return
        now = loop.time()
        renewed: dict[float, list[Lease]] = {}  # by ttl: the leases that share a due time and a deadline now
        guarded: set[float] = set()  # ttls of those with a body under them
        retry: list[Lease] = []
        on_renewed = self._on_renewed
        for lease, result in zip(group, results, strict=True):
            if self._leases.get(lease._hold) is not lease:
                continue  # released while the renewal was in flight
            if result is True:
                self._leave(lease)
                lease._renewed(sent)
                renewed.setdefault(lease._ttl, []).append(lease)
                if lease._bodies():
                    guarded.add(lease._ttl)
                if on_renewed is not None:
                    on_renewed(lease)
            elif result is False:
                self._drop_lost(
                    lease, "the server no longer has this hold (expired or taken)", LossReason.TAKEN_OR_EXPIRED
                )
            elif now >= lease._expires_at:
                self._drop_lost(
                    lease, f"could not renew before the trusted deadline: {plain(result)}", LossReason.RENEWAL_FAILED
                )
            else:
                self._leave(lease)
                error = plain(result)
                if lease._mark_at_risk(f"a renewal failed: {error}"):
                    self._on_at_risk(lease, lease._at_risk or "")  # (which logs it)
                else:
                    # The same error again is news to nobody: said once, at INFO.
                    level = logging.DEBUG if error == lease._last_error else logging.INFO
                    logger.log(level, "renewal of %r failed, retrying: %s", lease.name, error)
                lease._last_error = error
                lease._next_due = min(now + lease._backoff, lease._expires_at)
                lease._backoff = min(lease._backoff * 2, lease._ttl / 6)
                retry.append(lease)
        for ttl, leases in renewed.items():
            first = leases[0]
            self._schedule(leases, first._next_due, first._expires_at, guarded=ttl in guarded)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("renewed %d leases until %.3f", len(leases), first._expires_at)
        for lease in retry:
            self._schedule([lease], lease._next_due, lease._expires_at, guarded=bool(lease._bodies()))

    def _unanswered(self, group: list[Lease]) -> None:
        """A renewal of ``group`` has not answered within half the time left: its leases are at risk."""
        for lease in group:
            if self._leases.get(lease._hold) is lease and lease._mark_at_risk(
                "a renewal did not answer within half the time left"
            ):
                self._on_at_risk(lease, lease._at_risk or "")

    async def _renew_group(self, group: list[Lease], bound: float) -> tuple[list[bool | BaseException], bool]:
        """One renew call for ``group``, bounded by ``bound``: (results, whether the bound fired)."""
        items = [lease._renew_item() for lease in group]
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
        if self._leases.pop(lease._hold, None) is lease:
            self._leave(lease)
        lease._lose(reason, loss)
