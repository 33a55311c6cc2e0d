"""The holds of one client, and their lease: the session.

The trusted deadline is the send time of the last request of the session the
server answered, plus the negotiated session timeout, minus a margin: the
server cannot expire the session before then. While this client holds a
lock, the lease watchdog's renewals (one pipelined ``exists`` per held node,
one round trip) are the session's only heartbeat, so a client whose watchdog
stalls lets its session, and its locks, go, as a Redis key would expire.

The holder's own node is watched from its first renewal on (the watch rides
on that renewal's ``exists``, so a free lock costs a create, with the
children read pipelined behind it, and a delete): deleting it (an
administrator, or the session expiring) loses the lease at once; before that
first renewal, a deletion is found by the renewal itself. Watches belong to
a connection, so they are set again after every reconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..._values import LossReason
from ...abc import BackendHooks, RenewItem
from ._nodes import Node, Nodes
from ._session import WatchCallback
from ._wire import NO_NODE, ZkConnectionLoss, ZkError, delete_request, exists_request, get_data_request

__all__ = ["Holds"]


class Holds:
    """Every hold of this client by hold id (a queued one too), on one session."""

    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes
        self._session = nodes.session
        self._by_hold: dict[str, Node] = {}
        self.hooks: BackendHooks | None = None

    def get(self, hold: str) -> Node | None:
        return self._by_hold.get(hold)

    def add(self, node: Node) -> None:
        self._by_hold[node.hold] = node

    def forget(self, node: Node) -> None:
        if self._by_hold.get(node.hold) is node:
            del self._by_hold[node.hold]

    def held_paths(self) -> dict[str, Node]:
        """Our held nodes by path."""
        return {node.path: node for node in self._by_hold.values() if node.held and node.path is not None}

    def keepalive(self) -> bool:
        """Whether the session should ping by itself: not while we hold (the renewals are the heartbeat)."""
        return not any(node.held and not node.releasing and not node.gone for node in self._by_hold.values())

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One pipelined ``exists`` per held node, sent now: True if it is still ours."""
        session = self._session
        await session.wait_connected(None)  # the watchdog bounds this call
        sid = session.session_id
        futures: list[asyncio.Future[Any] | None] = []
        for item in items:
            node = self._by_hold.get(item.hold)
            if node is None or not self._nodes.alive(node) or node.path is None:
                futures.append(None)
            elif node.held and not node.releasing and node.armed != session.connection_seq:
                # the first renewal on a connection also sets the deletion watch
                node.armed = session.connection_seq
                futures.append(
                    session.submit(
                        exists_request(node.path, watch=True),
                        node.path,
                        watch=("data", self._held_watch(node)),
                    )
                )
            else:
                futures.append(session.submit(exists_request(node.path), node.path))
        if all(future is None for future in futures):
            await session.ping()  # still one round trip, so nothing is answered from stale state
        results: list[bool | BaseException] = []
        for future in futures:
            if future is None:
                results.append(False)
                continue
            try:
                reply = await future
            except ZkError as exc:
                results.append(False if exc.code == NO_NODE else exc)
            except ZkConnectionLoss as exc:
                results.append(exc)
            else:
                results.append(int(reply.stat.ephemeral_owner) == sid and session.session_id == sid)
        return results

    # -- releasing -------------------------------------------------------------------

    async def release(self, node: Node, window: float) -> bool:
        """Delete ``node``, held or queued: whether it held and this deleted it.

        A node whose create is unsettled (a cancelled acquire) is found by its
        GUID in the background. Waits at most ``window`` seconds for a
        connection (a request is given up after as long without an answer).
        A failed or unanswered delete raises (ZkError, ZkConnectionLoss, or
        what the socket raised) and goes on in the background until it
        succeeds or the session ends, so no node outlives its release while
        the session lives.
        """
        nodes = self._nodes
        mutex, node.mutex = node.mutex, None
        if mutex is not None:  # a semaphore's waiter: the next one's turn at the mutex
            await nodes.let_go(mutex)
        if not nodes.alive(node) or nodes.closed:
            # the session is known to be over (expired or closed): so are its nodes.
            # Past its timeout is not enough: until the server has expired it, any
            # request (a ping) revives it, and the node would then stay forever.
            self.forget(node)
            return False
        node.releasing = True
        if node.path is None or node.uncertain:
            self.forget(node)
            nodes.discard(node)
            return False
        session = self._session
        try:
            await session.wait_connected(window)
            await session.call(delete_request(node.path), node.path)
        except ZkError as exc:
            if exc.code != NO_NODE:
                self._finish_later(node)
                raise
            self.forget(node)
            return node.delete_sent and node.held  # an earlier, unanswered delete did it
        except BaseException:
            node.delete_sent = True
            self._finish_later(node)
            raise
        self.forget(node)
        return node.held

    def _finish_later(self, node: Node) -> None:
        """Keep deleting a released node in the background until done or its session ends."""
        if node.finisher is None or node.finisher.done():
            node.finisher = self._nodes.tasks.spawn(self._finish_release(node))

    async def _finish_release(self, node: Node) -> None:
        await self._nodes.cleanup(node)
        self.forget(node)

    # -- the deletion watch of a held node -------------------------------------------

    def _arm(self, node: Node) -> None:
        """Watch a held node: its deletion loses the lease at once."""
        if node.path is None or node.armed == self._session.connection_seq:
            return
        node.armed = self._session.connection_seq
        self._nodes.tasks.spawn(self._watch_held(node))

    def _held_watch(self, node: Node) -> WatchCallback:
        """The callback of a held node's deletion watch."""

        def fired(what: str) -> None:
            node.armed = -1
            if what != "disconnected" and not self._nodes.closed:
                self._arm(node)  # read it again: deleted, or just changed?

        return fired

    async def _watch_held(self, node: Node) -> None:
        if self._by_hold.get(node.hold) is not node or not node.held or node.releasing or node.path is None:
            return
        try:
            await self._session.call(
                get_data_request(node.path, watch=True), node.path, watch=("data", self._held_watch(node))
            )
        except ZkConnectionLoss:
            node.armed = -1  # armed again after the reconnect
        except ZkError as exc:
            if exc.code == NO_NODE:
                self._node_gone(node, "the lock node was deleted (removed on the server, or the session ended)")

    def _node_gone(self, node: Node, reason: str) -> None:
        if self._by_hold.get(node.hold) is not node or not node.held or node.releasing or node.gone:
            return
        node.gone = True
        if self.hooks is not None:
            self.hooks.lose([node.hold], reason, LossReason.TAKEN_OR_EXPIRED)

    # -- the session's news ----------------------------------------------------------

    def on_disconnected(self, reason: str) -> None:
        """The connection was lost: the holds are at risk until the session is confirmed alive again."""
        held = [node.hold for node in self._by_hold.values() if node.held and not node.releasing and not node.gone]
        if held and self.hooks is not None:
            self.hooks.at_risk(held, f"the ZooKeeper connection was lost ({reason}); the session may still live")

    def on_connected(self) -> None:
        """A (re)connection: watch the held nodes again."""
        if self._nodes.closed:
            return
        sid = self._session.session_id
        for node in list(self._by_hold.values()):
            if node.held and not node.gone and node.session == sid:
                self._arm(node)

    def on_expired(self, old_session: int) -> None:
        """The session expired, and every node it made: its holds are lost now."""
        lost = []
        for node in self._by_hold.values():
            if node.session == old_session and not node.gone:
                node.gone = True
                if node.held and not node.releasing:
                    lost.append(node.hold)
        if lost and self.hooks is not None:
            self.hooks.lose(lost, "the ZooKeeper session expired")
