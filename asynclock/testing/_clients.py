"""Clients for tests: an isolated ``memory://`` client that fails on leaving if the code under test leaked."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import asynclock

from .._client import Locks

__all__ = ["leaks", "memory_client"]


def leaks(locks: Locks) -> list[str]:
    """What ``locks`` still has going: each lease it holds and each acquire still waiting.

    A test that ends with either has leaked it: a lease that nobody releases
    is renewed for ever (until the client closes), and a waiting acquire is a
    task that never finished. Reads the client's state, no I/O.
    """
    found = []
    core = locks._core
    keeper = core.keeper
    for lease in keeper.holds() if keeper is not None else []:
        found.append(
            f"lease {lease.name!r} held (token {lease.token}, hold count {lease.hold_count}, owner {lease.owner})"
        )
    hub = core.hub
    for name, count in sorted(hub.waiters().items()) if hub is not None else []:
        found.append(f"{count} acquire(s) of {name!r} still waiting")
    for task in core.waits():
        found.append(f"an acquire still waiting in a queue (task {task.get_name()!r})")
    return found


@contextlib.asynccontextmanager
async def memory_client(*, ttl: float = 30.0, **options: Any) -> AsyncIterator[Locks]:
    """An isolated ``memory://`` client (a key prefix of its own), closed on leaving.

    Leaving the block normally raises ``AssertionError`` naming what the
    code inside leaked (see :func:`leaks`): a lease still held, an acquire
    still waiting. ``options`` go to :func:`asynclock.connect` (``on_event``,
    ``prefix``). The pytest fixture ``locks`` is this client.

    Example::

        async with asynclock.testing.memory_client() as locks:
            async with locks.lock("job"):
                ...
    """
    options.setdefault("prefix", f"test-{secrets.token_hex(4)}")
    locks = asynclock.connect("memory://", ttl=ttl, **options)
    try:
        yield locks
    except BaseException:
        await locks.aclose()
        raise
    left = leaks(locks)
    await locks.aclose()
    if left:
        raise AssertionError(
            f"the code under test left {len(left)} thing(s) going on its memory:// client "
            f"(prefix {options['prefix']!r}): " + "; ".join(left)
        )
