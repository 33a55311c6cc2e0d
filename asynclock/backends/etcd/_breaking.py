"""Breaking a lock (``locks.break_lock``): delete the key that holds it, whoever put it.

The delete is a transaction that compares the key's create revision with
the holder's token, so it never deletes a key that took the lock since. An
asynclock holder finds its key gone at its next renewal (within ttl/3) and
loses its lease; the holders of ``etcdctl lock`` and Go's Mutex are not told.
The next contender watches the deleted key, so it holds next, and its
key's create revision (its token) is larger.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..._values import LockInfo
from ._client import EtcdClient
from ._holds import Holds
from ._wire import EQUAL, TARGET_CREATE, Compare, Op

__all__ = ["break_holder"]


async def break_holder(
    client: EtcdClient,
    holds: Holds,
    read: Callable[[], Awaitable[LockInfo]],
    owner: str | None,
    timeout: float,
) -> LockInfo | None:
    """Delete the key holding the lock (only ``owner``'s, if given), as ``read`` shows it; what it broke,
    or None (free, another owner's, or released meanwhile)."""
    info = await read()
    if info.owner is None or info.token is None or (owner is not None and info.owner != owner):
        return None
    # (this client's holder is shown by its hold id, another's by its key)
    ours = {node.hold: node.contender.key for node in holds.nodes() if node.held and node.contender is not None}
    key = ours.get(info.owner, info.owner.encode())
    same = Compare(key, target=TARGET_CREATE, result=EQUAL, value=info.token)
    return info if (await client.txn([same], [Op.delete(key)], timeout=timeout)).succeeded else None
