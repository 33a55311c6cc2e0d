"""One acquisition's node, and its life on the server: created once, found again, deleted.

A create whose answer was lost with the connection is resolved by looking
for the GUID among the children (and checking the node's ephemeralOwner is
our session), never by creating blindly again. A node that cannot be deleted
now (no connection, or its create still unanswered) is deleted in the
background once it can be, until done or its session is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..._errors import LockError
from ..._timing import Backoff
from .._background import Background, until_done
from ._layout import LOCK_BASE, PROTECTED
from ._order import Rule, contenders_of, first_holds
from ._session import WatchCallback, ZkSession
from ._wire import (
    CONTAINER,
    EPHEMERAL,
    NO_NODE,
    NODE_EXISTS,
    SEQUENTIAL,
    ZkConnectionLoss,
    ZkError,
    children_request,
    create_request,
    delete_request,
    exists_request,
)

__all__ = ["Node", "Nodes", "Verify"]

logger = logging.getLogger("asynclock")

#: Longest pause between two attempts of a background deletion.
_CLEANUP_PAUSE = 0.5
#: How often a create is tried again after creating the parents it lacked.
_PARENT_RETRIES = 3

#: Given the contenders (in order) and our new node's name: raise if the queue refuses us.
Verify = Callable[[list[str], str], Awaitable[None]]


@dataclass(eq=False)
class Node:
    """One acquisition: its contender node and what we know about it."""

    name: str
    hold: str
    dir: str
    guid: str
    #: what follows the GUID in the node's name (the server appends the sequence)
    base: str = LOCK_BASE
    #: whether it holds, given the contenders in order and its own name
    rule: Rule = first_holds
    #: a semaphore's mutex: held first, then this node is created; let go once this node holds
    mutex: Node | None = None
    #: sees the queue once this node is in it, and may refuse it by raising
    verify: Verify | None = None
    #: waits on a children watch instead of its predecessor (a semaphore's lease:
    #: only the mutex holder waits there, so no herd)
    by_children: bool = False
    path: str | None = None
    czxid: int | None = None
    session: int = 0
    count: int = 1
    held: bool = False
    gone: bool = False
    releasing: bool = False
    delete_sent: bool = False
    #: a create was sent whose answer never came: the node may exist
    uncertain: bool = False
    #: what the node holds (a semaphore's lease: its permits)
    data: bytes = b""
    create_future: asyncio.Future[Any] | None = None
    #: connection on which the deletion watch of a held node is set
    armed: int = -1
    #: the background deletion of a release that could not finish
    finisher: asyncio.Task[None] | None = None
    #: what the look that queued it saw (holds, node ahead, contenders): the wait starts from it
    seen: tuple[bool, str | None, list[str]] | None = None


class Nodes:
    """The contender nodes of one session: create, adopt and delete them, and the background tasks that do it."""

    def __init__(self, session: ZkSession, *, chroot: str, acl: bytes, no_chroot: Callable[[], Exception]) -> None:
        self.session = session
        self.closed = False
        self._chroot = chroot
        self._acl = acl
        self._no_chroot = no_chroot
        #: the background deletions (and watches) of this session's nodes
        self.tasks = Background()

    def alive(self, node: Node) -> bool:
        """Whether ``node`` may still exist: not lost, and made (if at all) by the current session."""
        return not node.gone and (node.session == 0 or node.session == self.session.session_id)

    async def stop(self) -> None:
        """Stop the background deletions (the session is closed: the server deletes our nodes)."""
        self.closed = True
        self.tasks.cancel()
        await self.tasks.aclose(within=1.0)

    # -- creating ------------------------------------------------------------------

    def list_children(self, path: str, watch: WatchCallback | None = None) -> asyncio.Future[Any]:
        """Send a getChildren of ``path`` now (with a children watch calling ``watch``)."""
        request = children_request(path, watch=watch is not None)
        return self.session.submit(request, path, watch=None if watch is None else ("child", watch))

    async def create(self, node: Node, watch: WatchCallback | None = None) -> asyncio.Future[Any] | None:
        """Create our contender node, once, even across connection losses.

        Returns the answer to a getChildren (with a children watch calling
        ``watch``) sent right behind the create, or None when the node was
        found after a lost create answer. A connection loss raises and leaves
        the node uncertain: the next call looks for it by its GUID.
        """
        session = self.session
        base = f"{node.dir}/{PROTECTED}{node.guid}{node.base}"
        for attempt in range(_PARENT_RETRIES + 1):
            if node.uncertain and await self._adopt(node):
                return None
            future = session.submit(create_request(base, EPHEMERAL | SEQUENTIAL, data=node.data, acl=self._acl), base)
            node.session, node.uncertain, node.create_future = session.session_id, True, future
            listing: asyncio.Future[Any] | None = None
            with contextlib.suppress(ZkConnectionLoss):  # the create's own answer tells
                listing = self.list_children(node.dir, watch)
            try:
                if listing is not None:
                    # answered after the create (a session's answers come in
                    # order, and a dropped connection fails both): waiting on
                    # the listing leaves the create's future alone, so a
                    # cancelled acquire still learns which node it made
                    with contextlib.suppress(LockError):
                        await listing
                    if not future.done():  # pragma: no cover - the server answers in order
                        await asyncio.shield(future)
                    reply = future.result()
                else:
                    reply = await asyncio.shield(future)
            except ZkConnectionLoss:
                raise  # did it happen? _adopt finds out, after the reconnect
            except ZkError as exc:
                node.uncertain = False
                if exc.code == NO_NODE and attempt < _PARENT_RETRIES:
                    await self.ensure_parents(node.dir)
                    continue
                raise
            node.uncertain = False
            node.path = str(reply.path)
            node.czxid = int(reply.stat.created_zxid)
            return listing
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def _adopt(self, node: Node) -> bool:
        """After a lost create answer: find our node by its GUID; keep it if this session owns it."""
        session = self.session
        try:
            reply = await session.call(children_request(node.dir), node.dir)
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            node.uncertain = False
            return False
        ours = [child for child in contenders_of(reply.children) if node.guid in child]
        adopted = False
        for child in ours:
            path = f"{node.dir}/{child}"
            try:
                stat = await session.call(exists_request(path), path)
            except ZkError as exc:
                if exc.code == NO_NODE:
                    continue
                raise
            if not adopted and int(stat.stat.ephemeral_owner) == session.session_id:
                node.path, node.czxid, node.session = path, int(stat.stat.created_zxid), session.session_id
                adopted = True
                logger.debug("found our node %s of %r after a lost create answer", path, node.name)
            else:
                await self.delete_quietly(path)
        node.uncertain = False
        return adopted

    async def ensure_parents(self, path: str) -> None:
        """Create our prefix and lock znodes (containers) under the chroot, which must exist."""
        session = self.session
        parts = path.strip("/").split("/")
        chroot_depth = len(self._chroot.strip("/").split("/")) if self._chroot else 0
        for depth in range(chroot_depth + 1, len(parts) + 1):
            current = "/" + "/".join(parts[:depth])
            request = create_request(current, CONTAINER, container=True, acl=self._acl)
            try:
                await session.call(request, current)
            except ZkError as exc:
                if exc.code == NO_NODE and depth == chroot_depth + 1 and self._chroot:
                    raise self._no_chroot() from exc  # deleted since the client started
                if exc.code != NODE_EXISTS:
                    raise

    # -- deleting ------------------------------------------------------------------

    async def delete_quietly(self, path: str) -> None:
        """Delete ``path``, ignoring a ZooKeeper error or a lost connection."""
        with contextlib.suppress(LockError):
            await self.session.call(delete_request(path), path)

    async def let_go(self, node: Node) -> None:
        """Delete ``node`` now, in the caller's task; what cannot be deleted now goes in the background."""
        node.held = False
        if node.path is None and not node.uncertain and node.create_future is None:
            return  # never created
        settled = node.create_future is None or node.create_future.done()
        if node.path is None or node.uncertain or not settled or not self.session.connected:
            self.discard(node)
            return
        try:
            await self.session.call(delete_request(node.path), node.path)
        except ZkError as exc:
            if exc.code != NO_NODE:
                self.discard(node)
        except ZkConnectionLoss:
            self.discard(node)
        except BaseException:
            self.discard(node)  # sent, perhaps: the clean-up finds out
            raise

    def discard(self, node: Node) -> asyncio.Task[None]:
        """Delete ``node`` in the background (by path, or by GUID if its create is unsettled)."""
        return self.tasks.spawn(self.cleanup(node))

    async def cleanup(self, node: Node) -> None:
        """Delete ``node``; retried until done or moot (its session is over, or the client closed)."""
        session = self.session

        def moot() -> bool:
            # a session's ephemeral nodes end with it
            return self.closed or (node.session != 0 and node.session != session.session_id)

        async def step() -> bool:
            future = node.create_future
            if future is not None and not future.done():
                with contextlib.suppress(LockError):
                    await asyncio.shield(future)
            if future is not None and future.done() and not future.cancelled() and future.exception() is None:
                node.path, node.uncertain = str(future.result().path), False
            if not node.uncertain and node.path is None:
                return True  # nothing was created: no need to wait for a connection
            await session.wait_connected(None)
            if moot():
                return False
            if node.path is not None and not node.uncertain:
                await self.delete_quietly(node.path)
                if not session.connected:
                    raise ZkConnectionLoss("disconnected during delete")
                return True
            reply = await session.call(children_request(node.dir), node.dir)
            for child in reply.children:
                if node.guid in child:
                    await self.delete_quietly(f"{node.dir}/{child}")
            return session.connected  # (else the deletes may not have arrived: again)

        try:
            await until_done(step, moot=moot, backoff=Backoff(cap=_CLEANUP_PAUSE), retry=(ZkConnectionLoss,))
        except ZkError as exc:
            if exc.code != NO_NODE:  # (NoNode: its directory is gone, and the node with it)
                logger.warning("could not delete the ZooKeeper node of %r: %s", node.name, exc)
