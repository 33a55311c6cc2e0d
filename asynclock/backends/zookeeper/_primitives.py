"""The node a new hold of each primitive queues, on Curator's layouts (see :mod:`._layout`).

A lock (plain or fair), a writer, a reader and an election candidate are one
node each, under the primitive's znode, differing in the base of their name
and in the rule that says when they hold (:mod:`._order`). A semaphore's
lease is queued behind a node of its mutex, holds when it is one of the first
``permits`` leases, and first checks that the other leases asked for as many
permits (:func:`._describe.check_permits`, which raises ValueError).
"""

from __future__ import annotations

import uuid

from ...abc import LockRef
from ._describe import check_permits
from ._layout import LATCH_BASE, LEASE_BASE, READ, SEM_LEASES, SEM_LOCKS, WRITE, permits_data
from ._nodes import Node
from ._order import reader_holds
from ._session import ZkSession

__all__ = ["node_for"]


def node_for(ref: LockRef, hold: str, path: str, session: ZkSession) -> Node:
    """The node a new hold ``hold`` of ``ref`` queues under the znode ``path`` (a semaphore: behind its mutex)."""
    guid = str(uuid.uuid4())
    if ref.kind == "election":
        return Node(ref.name, hold, path, guid, base=LATCH_BASE, data=(ref.identity or "").encode())
    if ref.kind == "write":
        return Node(ref.name, hold, path, guid, base=f"-{WRITE}")
    if ref.kind == "read":
        return Node(ref.name, hold, path, guid, base=f"-{READ}", rule=reader_holds)
    if ref.kind != "semaphore":
        return Node(ref.name, hold, path, guid)
    permits = ref.permits
    leases = f"{path}/{SEM_LEASES}"

    def first_permits(contenders: list[str], mine: str) -> tuple[bool, str | None]:
        return contenders.index(mine) < permits, None

    async def same_permits(contenders: list[str], mine: str) -> None:
        others = [child for child in contenders if child != mine]
        await check_permits(session, ref.name, leases, others, permits)

    mutex = Node(ref.name, hold, f"{path}/{SEM_LOCKS}", str(uuid.uuid4()))
    return Node(
        ref.name,
        hold,
        leases,
        guid,
        base=LEASE_BASE,
        rule=first_permits,
        mutex=mutex,
        verify=same_permits,
        by_children=True,
        data=permits_data(permits),
    )
