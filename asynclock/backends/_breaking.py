"""Breaking a plain lock (``locks.break_lock``) where a release by any hold's identity works.

The Redis family's ``release(ref, hold)`` releases the hold ``hold`` whoever's
it is, the way its owner's release would: the lock goes to the next waiter
(or stays free with its last token), and the next token is larger. So a
break reads who holds the lock and releases that hold; if the lock changed
hands in between, the release does nothing and the break reads again.
"""

from __future__ import annotations

from .._errors import LockError
from .._values import LockInfo
from ..abc import Backend, LockRef

__all__ = ["ATTEMPTS", "break_by_release"]

#: How many times a break reads and releases before it gives up on a lock that keeps changing hands.
ATTEMPTS = 5


async def break_by_release(backend: Backend, ref: LockRef, owner: str | None) -> LockInfo | None:
    """Release the hold that holds ``ref`` (only ``owner``'s, if given); what it broke, or None."""
    for _ in range(ATTEMPTS):
        info = await backend.info(ref)
        if info.owner is None or (owner is not None and info.owner != owner):
            return None
        if await backend.release(ref, info.owner):
            return info
    raise LockError(f"lock {ref.name!r} changed hands {ATTEMPTS} times while it was being broken; try again")
