"""``locks.break_lock(name)``: an operator force-releases a stuck lock.

The backend takes the hold away on the server (``abc.Breaks``), so that the
next holder is served with a larger token; the holder finds out at its next
renewal at the latest (at once where the backend lets it: a watch on its
node, a word to its client), and its body is cancelled. A hold of this very
client is lost here at once. Every break is logged at WARNING with who held
the lock.
"""

from __future__ import annotations

import logging

from ._core import Core
from ._validate import check_name
from ._values import LockInfo, LossReason
from .abc import Breaks, LockRef

__all__ = ["BROKEN", "break_lock"]

logger = logging.getLogger("asynclock")

#: What the holder's ``LockLost`` says when this client broke its own hold.
BROKEN = "the lock was broken (force-released by locks.break_lock or asynclock break)"


async def break_lock(core: Core, name: str, owner: str | None) -> LockInfo | None:
    """Force-release the plain lock ``name`` (only ``owner``'s hold, if given); what was broken, or None."""
    core.check_open()
    ref = LockRef("lock", check_name(name))
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise TypeError(f"owner must be a non-empty str (an owner as info() shows it), not {owner!r}")
    backend = core.backend
    if not isinstance(backend, Breaks):
        raise NotImplementedError(f"the {backend.scheme} backend cannot break a lock")
    keeper = await core.start()
    broken = await backend.break_lock(ref, owner)
    if broken is None or broken.owner is None:
        return None
    keeper.lose([broken.owner], BROKEN, LossReason.TAKEN_OR_EXPIRED)  # (a hold of this client's: lost now)
    logger.warning(
        "lock %r broken by client %s: it was held by %s (token %s, hold count %d, %s of its lease left);"
        " that holder's body is cancelled when it finds out, at its next renewal at the latest",
        name,
        core.client_id,
        broken.owner,
        "none" if broken.token is None else broken.token,
        broken.hold_count,
        "unknown" if broken.ttl is None else f"{broken.ttl:.2f} s",
    )
    return broken
