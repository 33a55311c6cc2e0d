"""The recipe: queueing a node until it holds.

A waiter watches only the node its rule names (:mod:`._order`). When that
one goes and it was the only contender ahead, the waiter holds at once (a
node is never created ahead of an existing one: the sequence only grows);
otherwise it re-reads the children, as it does after any reconnect (watches
belong to a connection). A semaphore's lease is queued behind its mutex:
the mutex is held first, the lease's node created then, and the mutex let go
once the lease holds. Creating, finding and deleting the nodes is
:mod:`._nodes`' part.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._nodes import Node, Nodes
from ._order import contenders_of
from ._session import WatchCallback
from ._wire import NO_NODE, ZkConnectionLoss, ZkError, get_data_request

__all__ = ["Recipe"]


class Recipe:
    """Moves nodes of one session towards holding: look at the queue, wait on the node ahead."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.session = nodes.session

    async def wait_connected(self, until: float | None) -> None:
        """Wait for a connection: until the loop time ``until``, and never longer than one session timeout."""
        limit = self.session.timeout
        if until is not None:
            limit = min(limit, max(0.0, until - asyncio.get_running_loop().time()))
        await self.session.wait_connected(limit)

    # -- queueing ------------------------------------------------------------------

    async def advance(self, node: Node, *, wait: bool, until: float | None = None) -> bool:
        """Move ``node`` towards holding: True once it holds, False when it has to wait.

        With ``wait``, it waits (watching its predecessor, or a semaphore's
        lease the children) until it holds or the loop time ``until`` passes,
        and rides out a dropped connection until then. Without, it answers
        after one look (a connection loss raises, for the caller to retry).
        A semaphore's ``node`` is created only once its mutex holds, and the
        mutex is let go as soon as ``node`` holds (before this returns, so
        that an acquire made after it never finds the mutex taken).
        """
        loop = asyncio.get_running_loop()
        while True:
            if self.nodes.closed:
                raise ZkConnectionLoss("the ZooKeeper client is closed")
            mutex = node.mutex
            if mutex is not None and mutex.held and not self.nodes.alive(mutex):
                mutex.held = False  # its session expired: take it again
            current = mutex if mutex is not None and not mutex.held else node
            by_children = current is node and node.by_children
            woken = asyncio.Event()
            news: list[str] = []

            def wake(what: str, woken: asyncio.Event = woken, news: list[str] = news) -> None:
                news.append(what)
                woken.set()

            child_watch = wake if wait and by_children else None
            watched: tuple[str, str] | None = ("child", current.dir) if child_watch else None
            try:
                # (no connection by ``until``, or within a session timeout: the caller retries)
                await self.wait_connected(until if wait else None)
                seen, current.seen = current.seen, None
                if seen is None or child_watch is not None or not wait:
                    try:
                        seen = await self._look(current, child_watch)
                    except ZkConnectionLoss:
                        if not wait:
                            raise
                        continue  # look again once reconnected
                if seen is None:
                    continue  # our node went (session expired, an administrator): queue again
                holds, ahead, contenders = seen
                if holds or (wait and await self._wait(current, ahead, contenders, until, wake, woken, news)):
                    if current is not node:
                        current.held = True
                        continue  # the semaphore's mutex is ours: on to its lease
                    node.held = True
                    if mutex is not None:
                        node.mutex = None
                        await self.nodes.let_go(mutex)
                    return True
                if not wait:
                    current.seen = seen  # the wait that follows needs no second look
                    return False
                if until is not None and loop.time() >= until:
                    return False
            finally:
                if watched is not None:
                    self.session.unwatch(*watched, wake)

    async def _look(self, node: Node, watch: WatchCallback | None) -> tuple[bool, str | None, list[str]] | None:
        """Create ``node`` if it has none, read the contenders: whether it holds, whom to watch, the contenders.

        None when the node is no longer among the contenders (it has to queue again).
        """
        listing: asyncio.Future[Any] | None = None
        if node.path is None or not self.nodes.alive(node):
            node.path, node.gone = None, False
            # the children are read in the same write as the create: the
            # server answers a session's requests in order, so the list
            # has our node in it (one round trip when the lock is free)
            listing = await self.nodes.create(node, watch)
            assert node.path is not None
        if listing is None:
            listing = self.nodes.list_children(node.dir, watch)
        try:
            reply = await listing
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            node.path = None
            return None
        contenders = contenders_of(reply.children)
        mine = node.path.rsplit("/", 1)[1]
        if mine not in contenders:
            node.path = None
            return None
        for twin in contenders:
            if node.guid in twin and twin != mine:  # a duplicate create: never ours to keep
                self.nodes.tasks.spawn(self.nodes.delete_quietly(f"{node.dir}/{twin}"))
        if node.verify is not None:
            await node.verify(contenders, mine)
            node.verify = None
        holds, ahead = node.rule(contenders, mine)
        return holds, ahead, contenders

    async def _wait(
        self,
        node: Node,
        ahead: str | None,
        contenders: list[str],
        until: float | None,
        wake: WatchCallback,
        woken: asyncio.Event,
        news: list[str],
    ) -> bool:
        """Wait for news of the node ``node`` waits behind (or its children); whether it holds now for sure."""
        session = self.session
        predecessor = None if node.by_children or ahead is None else f"{node.dir}/{ahead}"
        if predecessor is not None:
            try:
                await session.call(get_data_request(predecessor, watch=True), predecessor, watch=("data", wake))
            except ZkConnectionLoss:
                return False
            except ZkError as exc:
                if exc.code != NO_NODE:
                    raise
                return False  # gone already: read the children again
        try:
            async with asyncio.timeout_at(until):
                await woken.wait()
        except TimeoutError:
            return False
        finally:
            if predecessor is not None:
                session.unwatch("data", predecessor, wake)
        if predecessor is None or news[:1] != ["deleted"]:
            return False
        # Nodes are never created ahead of an existing one (the sequence only
        # grows), so if the rule holds without the node that went, it holds
        # now: no need to read again.
        assert node.path is not None
        holds, _ = node.rule([child for child in contenders if child != ahead], node.path.rsplit("/", 1)[1])
        return holds and self.nodes.alive(node) and session.connected
