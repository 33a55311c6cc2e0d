"""Giving a hold back by its identity: after ``release()``, after a loss, and
after an acquire that was cut short (its outcome unknown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, LockError, plain, server_of, unavailable
from ._timing import Backoff, Deadlines, request_window

if TYPE_CHECKING:
    from ._lease import Lease
    from .abc import Backend

__all__ = ["AGAIN_AFTER", "give_back_cut_short", "release_by_identity", "settle"]

logger = logging.getLogger("asynclock")

#: How long after giving back a try cut short its hold is released once more, in seconds.
AGAIN_AFTER = 0.05


async def release_by_identity(
    backend: Backend,
    lease: Lease,
    *,
    raise_errors: bool,
    give_up: float | None = None,
    deadlines: Deadlines | None = None,
    quiet: bool = False,
) -> bool:
    """Release ``lease`` by its hold id, retrying failed requests; whether the server released it.

    With ``raise_errors`` (an explicit ``release()``) it retries until the
    lease's trusted deadline (at least one request window) and then raises
    BackendUnavailable; otherwise (background clean-up) until the server must
    have expired the hold by itself, and then gives up, saying so at INFO
    (at DEBUG when ``quiet``: the caller said already that the release
    failed). A ConfigurationError is never retried.
    """
    loop = asyncio.get_running_loop()
    now = loop.time()
    if give_up is None:
        if raise_errors:
            give_up = max(lease._expires_at, now + request_window(lease._lease_time))
        else:
            # Past this time the server has expired the hold by itself.
            give_up = max(lease._expires_at + 2 * lease._ttl, now + 0.05)
    if deadlines is None:
        deadlines = Deadlines()
    backoff = Backoff()
    ambiguous = False
    while True:
        try:
            with deadlines.bound(give_up):
                released = await backend.release(lease._ref, lease._hold)
        except (LockError, OSError, TimeoutError) as exc:
            ambiguous = True
            pause = backoff.next()
            if isinstance(exc, ConfigurationError) or loop.time() + pause >= give_up:
                if raise_errors:
                    raise unavailable(exc, server_of(backend)) from exc
                level = logging.DEBUG if quiet else logging.INFO
                logger.log(level, "could not release %r (%s); it expires by itself", lease.name, plain(exc))
                return False
            await asyncio.sleep(pause)
            continue
        # After a failed attempt whose fate is unknown, "not the holder" may
        # mean that attempt went through: the lock is free either way.
        return released or (ambiguous and loop.time() < lease._expires_at)


async def settle(
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]], cleanup: Coroutine[Any, Any, Any], within: float
) -> None:
    """Run ``cleanup`` in a task of its own and wait for it, through repeated
    cancellations of the caller (anyio delivers a scope's again and again), for
    at most ``within`` seconds; past that it goes on in the background, so a
    cancellation is not held up for the several ttls a clean-up may take."""
    task = spawn(cleanup)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    while not task.done():
        left = give_up - loop.time()
        if left <= 0:
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=left)


async def give_back_cut_short(backend: Backend, lease: Lease) -> None:
    """Release the hold of a try cut short (cancelled, or past its bound) by its identity, and once
    more ``AGAIN_AFTER`` later.

    The try may still be on its way to the server when the first release
    gets there: a client whose requests are not ordered (a Cluster client's
    pooled connections, gRPC streams) may have them run the other way round,
    and the try would then take the lock for a hold nobody renews or
    releases, for a whole ttl. A server that got the try at all runs it
    within that pause; the second release finds it then (a release of a
    hold that has nothing is a no-op, and the hold id is never used again).
    """
    await release_by_identity(backend, lease, raise_errors=False, quiet=True)
    await asyncio.sleep(AGAIN_AFTER)
    await release_by_identity(backend, lease, raise_errors=False, quiet=True)
