"""Singleton jobs: ``@locks.singleton(name, at_most=..., at_least=...)``.

A call tries the lock ``name`` once (``timeout=0``, a lease of its own): taken
(another replica runs the job, or started it less than ``at_least`` seconds
ago) means skipped; held means the job runs here, in the caller's task,
under a cancel scope that ``at_most`` and a loss of the lease cancel. After
the job, the lease is kept (renewed) until ``at_least`` seconds after the
start and then released, in the background: the caller does not wait for it.
This is ShedLock's rule (lockAtLeastFor, lockAtMostFor) on a lease.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, ParamSpec, TypeVar

import anyio

from ._core import Core
from ._errors import LockError, LockLost, LockTimeout, NotHeld, plain
from ._lease import Lease
from ._lock import Lock
from ._owner import current_owner
from ._timing import request_window
from ._values import LossReason

__all__ = ["JobRun", "Singleton", "check_bounds"]

logger = logging.getLogger("asynclock")

P = ParamSpec("P")
R = TypeVar("R")


def check_bounds(at_most: object, at_least: object) -> tuple[float, float]:
    """``at_most`` > 0 and 0 <= ``at_least`` <= ``at_most``, finite numbers of seconds."""
    bounds = []
    for what, value in (("at_most", at_most), ("at_least", at_least)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
        bounds.append(number)
    most, least = bounds
    if most <= 0:
        raise ValueError(f"at_most must be more than 0 seconds, got {at_most!r}")
    if least > most:
        raise ValueError(f"at_least ({at_least!r} s) must not be more than at_most ({at_most!r} s)")
    return most, least


@dataclass(frozen=True, slots=True)
class JobRun(Generic[R]):
    """What one call of a singleton job did: ``await job.attempt()`` returns it.

    ``ran`` says whether the job ran here; ``value`` is what it returned (None
    when skipped); ``token`` the fencing token of the run (None when skipped).
    """

    ran: bool
    value: R | None
    token: int | None


class Singleton(Generic[P, R]):
    """A job that runs on one replica at a time, at most once per ``at_least`` seconds.

    Made by the decorator ``@locks.singleton(name, at_most=..., at_least=...)``.
    Calling it runs the job here and returns what the job returned, unless
    another replica runs it or started it less than ``at_least`` seconds ago:
    then it returns None at once (``await job.attempt()`` tells the two apart).

    * ``at_most``: the job is cancelled, its lock freed and TimeoutError raised
      if it runs longer.
    * ``at_least``: the lock stays held (renewed, not past it) until that many
      seconds after the start, even when the job ended sooner, so replicas
      whose schedules or clocks differ by less do not run it twice. If this
      process dies (or closes its client) before then, the lock goes when its
      hold expires: ``ttl`` after its last renewal on memory:// and Redis (a
      ``ttl`` of at least ``at_least`` keeps it through a crash), with the
      session on ZooKeeper (a session timeout after a crash, at once on a
      close).
    * An exception of the job propagates to the caller; a loss of the lock
      while the job runs cancels it and raises LockLost.

    Each call emits a ``LockEvent``: ``ran`` or ``skipped``.

    Example::

        @locks.singleton("nightly-report", at_most=600, at_least=60)
        async def nightly_report() -> None:
            await build_report()

        await nightly_report()      # every replica calls it; one runs it
    """

    __slots__ = ("__dict__", "_core", "_func", "_lock", "at_least", "at_most", "name")

    def __init__(
        self,
        core: Core,
        lock: Lock,
        func: Callable[P, Awaitable[R]],
        at_most: float,
        at_least: float,
    ) -> None:
        self._core = core
        self._lock = lock
        self._func = func
        self.name = lock.name
        self.at_most = at_most
        self.at_least = at_least
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"<Singleton {self.name!r} at_most={self.at_most} at_least={self.at_least}>"

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R | None:
        """Run the job here unless it runs elsewhere or ran less than ``at_least`` ago; None if skipped."""
        return (await self.attempt(*args, **kwargs)).value

    async def attempt(self, *args: P.args, **kwargs: P.kwargs) -> JobRun[R]:
        """Like calling the job, but says whether it ran: a :class:`JobRun`.

        Raises what the job raises, TimeoutError when it ran longer than
        ``at_most``, LockLost when the lock was lost while it ran, and
        BackendUnavailable when the server could not be asked (the job did not run).
        """
        core = self._core
        loop = asyncio.get_running_loop()
        try:
            # A lease of its own (no task owns it): it outlives this call by up to at_least.
            lease = await self._lock.acquire(timeout=0, detached=True)
        except LockTimeout:
            core.events.emit(
                "skipped",
                self.name,
                current_owner(),
                None,
                reason="another run holds it (running, or started less than at_least ago)",
            )
            return JobRun(False, None, None)
        started = loop.time()
        scope = anyio.CancelScope(deadline=started + self.at_most)
        lease._add_body(scope)
        keeper = core.keeper
        if keeper is not None:
            keeper.guard(lease)
        why: str | None = None
        try:
            with scope:
                value = await self._func(*args, **kwargs)
        except BaseException as exc:
            why = f"the job raised {exc!r}"
            raise
        finally:
            lease._remove_body(scope)
            core.body_ended()
            took = loop.time() - started
            if scope.cancelled_caught:
                why = lease.lost_reason if lease.lost else f"cut off after at_most ({self.at_most:g} s)"
            core.events.emit("ran", self.name, lease.owner, lease.token, held_s=took, reason=why)
            await self._keep_until(lease, started + (self.at_least if not scope.cancelled_caught else 0.0))
        if scope.cancelled_caught:
            if lease.lost:
                raise LockLost(self.name, lease.lost_reason or "lost", lease._loss or LossReason.RENEWAL_FAILED)
            raise TimeoutError(f"singleton job {self.name!r} ran longer than at_most={self.at_most:g}s: cancelled")
        return JobRun(True, value, lease.token)

    async def _keep_until(self, lease: Lease, until: float) -> None:
        """Keep ``lease`` until the loop time ``until``, then release it.

        The watchdog keeps renewing it, each renewal making the server hold
        it until ``until`` (and a request window), not past it: so it stays
        held until then if this process dies or closes its client, where the
        hold is not a session's (memory://, Redis).
        """
        if not lease._held or lease.lost:
            return
        loop = asyncio.get_running_loop()
        core = self._core
        left = until - loop.time()
        if left > 0:
            lease._keep_until(until)
            core.later(until, lambda: core.spawn(_release_quietly(lease)))
            # Make the server's hold end at ``until`` now, not at the next renewal.
            try:
                async with asyncio.timeout(request_window(lease._lease_time)):
                    await core.backend.renew([lease._renew_item()])
            except (LockError, OSError, TimeoutError) as exc:
                logger.info("could not extend singleton job %r's lock to at_least: %s", lease.name, plain(exc))
            return
        try:
            await lease.release()
        except (NotHeld, LockError) as exc:
            # Lost meanwhile, or the server is away: nobody renews it, it expires by itself.
            logger.info("release of singleton job %r's lock failed, it expires by itself: %s", lease.name, plain(exc))


async def _release_quietly(lease: Lease) -> None:
    """The end of an ``at_least`` hold."""
    if not lease._held:
        return
    try:
        await lease.release()
    except LockError as exc:
        logger.info("release of singleton job %r's lock failed, it expires by itself: %s", lease.name, plain(exc))


def make_singleton(
    core: Core, make_lock: Callable[[], Lock], at_most: object, at_least: object
) -> Callable[[Callable[P, Awaitable[R]]], Singleton[P, R]]:
    """The decorator ``locks.singleton(...)`` returns (arguments checked here, before any I/O)."""
    most, least = check_bounds(at_most, at_least)
    lock = make_lock()

    def decorate(func: Callable[P, Awaitable[R]]) -> Singleton[P, R]:
        if not callable(func):
            raise TypeError(f"@locks.singleton decorates an async function, not {type(func).__name__}")
        return Singleton(core, lock, func, most, least)

    return decorate
