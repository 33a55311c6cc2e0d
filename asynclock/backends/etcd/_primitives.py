"""The node a new hold of each primitive queues (the recipes are :mod:`._recipe`'s).

A lock (plain or fair) and an election candidate are the client's one key of
a Mutex or an Election: their nodes take turns for it (``Node.turns``). A
writer and a reader of a read-write lock have keys of their own. A
semaphore's lease queues behind its own key of the semaphore's mutex, and
checks, once it holds the mutex and before its lease key is put, that the
other leases asked for as many permits (ValueError otherwise).
"""

from __future__ import annotations

from ...abc import LockRef
from ._client import EtcdClient
from ._describe import check_permits
from ._node import Node
from ._recipe import candidate, mutex, reader, semaphore_lease, semaphore_mutex, writer
from ._session import Session

__all__ = ["node_for"]


def node_for(ref: LockRef, hold: str, ttl: float, key: str, serial: int, client: EtcdClient, session: Session) -> Node:
    """The node of a new hold ``hold`` of ``ref``, whose lock key is ``key``; ``serial`` makes
    its keys unique among the client's (those that are not keyed by the lease alone)."""
    if ref.kind == "election":
        # (the Mutex and the Election key a contender by its lease: the client's tasks take turns)
        identity = ref.identity or ""
        return Node(ref.name, hold, ttl, lambda lease: candidate(key, lease, identity), turns=key)
    if ref.kind in ("lock", "fair"):
        return Node(ref.name, hold, ttl, lambda lease: mutex(key, lease), turns=key)
    if ref.kind == "write":
        return Node(ref.name, hold, ttl, lambda lease: writer(key, lease, serial))
    if ref.kind == "read":
        return Node(ref.name, hold, ttl, lambda lease: reader(key, lease, serial))
    permits = ref.permits
    node = Node(ref.name, hold, ttl, lambda lease: semaphore_lease(key, lease, serial, permits))
    node.mutex = Node(ref.name, hold, ttl, lambda lease: semaphore_mutex(key, lease, serial))
    leases = f"{key}/leases/".encode()
    node.verify = lambda: check_permits(client, ref.name, leases, permits, session.window())
    return node
