"""Breaking a plain lock (``locks.break_lock``) where a release by any hold's identity works.

The Redis family's ``release(ref, hold)`` releases the hold ``hold`` whoever's
it is, the way its owner's release would: the lock goes to the next waiter
(or stays free with its last token), and the next token is larger. So a
break reads who holds the lock and releases that hold. If the lock changed
hands in between, the release does nothing and neither does the break: the
holder it read let go, and the one that took the lock since is not the one
an operator decided to break.
"""

from __future__ import annotations

from .._values import LockInfo
from ..abc import Backend, LockRef

__all__ = ["break_by_release"]


async def break_by_release(backend: Backend, ref: LockRef, owner: str | None) -> LockInfo | None:
    """Release the hold that holds ``ref`` (only ``owner``'s, if given); what it broke, or None."""
    info = await backend.info(ref)
    if info.owner is None or (owner is not None and info.owner != owner):
        return None
    return info if await backend.release(ref, info.owner) else None
