"""Who holds a lock and who waits, read from ``pg_locks`` (``_sql.LOCKS_ON``) and the holders' application_name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...abc import LockRef
from ._keys import APP_TAG

__all__ = ["read_holders"]


def read_holders(ref: LockRef, rows: Sequence[Any], check: str) -> tuple[list[str], int]:
    """The holders of ``ref`` (hold ids, or ``pid N (application)`` for sessions not of asynclock) and the waiters.

    ``check`` is the name's :func:`~._keys.name_check`: a session of asynclock
    whose application_name carries another check holds a name whose key
    collides with this one, not this name.
    """
    holders: list[str] = []
    waiters = 0
    for row in rows:
        if ref.kind == "semaphore" and row["main"]:
            # The gate: queued for it, or holding it as the head waiter (a
            # newcomer's instant shared hold is not waiting).
            if not row["granted"] or row["mode"] == "ExclusiveLock":
                waiters += 1
            continue
        if not row["granted"]:
            waiters += 1
            continue
        parts = str(row["app"] or "").split(" ", 2)
        if len(parts) == 3 and parts[0] == APP_TAG:
            if parts[1] == check:
                holders.append(parts[2])
        else:
            holders.append(f"pid {row['pid']} ({row['app'] or 'not asynclock'})")
    return holders, waiters
