"""The holds of one etcd client: every acquisition by hold id, which of them hold now, their renewal and loss.

Every hold of a client is under the client's one lease (:mod:`._session`).
A renewal is one keep-alive of that lease and, sent with it, one
transaction (of at most etcd's ``--max-txn-ops`` reads) that reads the held
keys: a key someone else deleted, or one whose create revision changed, is
a lost hold. When the lease is gone, every hold under it is lost at once and
every waiter reads again, to queue under the next lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ..._values import LossReason
from ...abc import Acquired, BackendHooks, RenewItem
from ._client import EtcdClient
from ._node import Node
from ._queue import Queue
from ._replies import TxnResult
from ._session import Lease, Session
from ._wire import Op

__all__ = ["Holds"]

#: Most operations of one etcd transaction (etcd's ``--max-txn-ops`` default).
_MAX_TXN_OPS = 128


class Holds:
    """Every acquisition this client has a key (or a turn) for, by hold id, and those that hold now."""

    def __init__(self, client: EtcdClient, session: Session, queue: Queue) -> None:
        self._client = client
        self._session = session
        self._queue = queue
        self._nodes: dict[str, Node] = {}
        #: the nodes that hold now (the watchdog keeps the lease alive while there are any)
        self._held: set[Node] = set()
        self.hooks: BackendHooks | None = None

    def get(self, hold: str) -> Node | None:
        return self._nodes.get(hold)

    def add(self, node: Node) -> None:
        self._nodes[node.hold] = node

    def pop(self, hold: str) -> Node | None:
        return self._nodes.pop(hold, None)

    def nodes(self) -> Iterable[Node]:
        return self._nodes.values()

    def forget(self, node: Node) -> None:
        """``node`` is no longer this client's (it left the queue)."""
        if self._nodes.get(node.hold) is node:
            del self._nodes[node.hold]
        self.let_go_of(node)

    def let_go_of(self, node: Node) -> None:
        """``node`` holds no more; after the last hold the lease needs the backend's keep-alives again."""
        if node in self._held:
            self._held.discard(node)
            if not self._held:
                self._session.holds_ended()

    def acquired(self, node: Node) -> Acquired:
        """Held: the token is the key's create revision, the proof the confirmation of its lease."""
        assert node.lease is not None
        self._held.add(node)
        return Acquired(node.revision, confirmed_at=node.lease.confirmed_at)

    def holding(self) -> bool:
        return bool(self._held)

    async def renew(self, items: Sequence[RenewItem], timeout: float) -> list[bool | BaseException]:
        """One keep-alive of the client's lease and one transaction reading the held keys.

        True for a hold whose key is still the one it created under the live
        lease; raises what the keep-alive or a read raised (our errors).
        """
        lease = self._session.usable()
        nodes = [self._nodes.get(item.hold) for item in items]
        if lease is None:
            return [False] * len(items)
        live = [node for node in nodes if node is not None and node.held and node.lease is lease]
        keys = [node.contender.key for node in live if node.contender is not None]
        reads = [
            self._client.txn([], [Op.range(key) for key in keys[i : i + _MAX_TXN_OPS]], timeout=timeout)
            for i in range(0, len(keys), _MAX_TXN_OPS)
        ]
        answers = await asyncio.gather(self._session.keepalive(lease, timeout), *reads, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        if answers[0] is not True:
            return [False] * len(items)
        found: dict[bytes, int] = {}
        for txn in answers[1:]:
            assert isinstance(txn, TxnResult)
            for index in range(len(txn.responses)):
                for kv in txn.range(index).kvs:
                    found[kv.key] = kv.create_revision
        return [
            node is not None
            and node.lease is lease
            and node.contender is not None
            and found.get(node.contender.key) == node.revision
            for node in nodes
        ]

    def lease_gone(self, lease: Lease, reason: str, expired: bool) -> None:
        """The lease ``lease`` is gone: every hold under it is lost, waiters queue again."""
        self._queue.lease_gone()
        gone = [node for node in self._held if node.lease is lease]
        for node in gone:
            self._held.discard(node)
        lost = [node.hold for node in gone]
        if lost and self.hooks is not None:
            # what carried the holds ended (etcd says so), or was not confirmed by their deadline
            loss = LossReason.CONNECTION_LOST if expired else LossReason.RENEWAL_FAILED
            self.hooks.lose(lost, f"the etcd lease was lost: {reason}", loss)
