"""Breaking a lock (``locks.break_lock``): delete the node that holds it, whoever made it.

An asynclock holder watches its node (from its first renewal on) and loses
its lease at once; before that, its first renewal finds the node gone.
Curator's and kazoo's holders are not told. The next contender watches the
deleted node, so it holds next, and its node's czxid (its token) is larger.
"""

from __future__ import annotations

from ..._values import LockInfo
from ...abc import LockRef
from ._describe import describe
from ._holds import Holds
from ._session import ZkSession
from ._wire import NO_NODE, ZkError, delete_request

__all__ = ["break_holder"]


async def break_holder(session: ZkSession, holds: Holds, ref: LockRef, key: str, owner: str | None) -> LockInfo | None:
    """Delete the node holding the lock at the znode ``key`` (only ``owner``'s, if given); what it broke,
    or None (free, another owner's, or released meanwhile)."""
    info = await describe(session, holds, ref, key)
    if info.owner is None or (owner is not None and info.owner != owner):
        return None
    ours = holds.get(info.owner)  # (this client's holder is shown by its hold id, another's by its node)
    path = ours.path if ours is not None and ours.path is not None else f"{key}/{info.owner}"
    try:
        await session.call(delete_request(path), path)
    except ZkError as exc:
        if exc.code != NO_NODE:
            raise
        return None  # released meanwhile
    return info
