"""The queue of an etcd lock: contender keys created, waited on, and deleted.

A :class:`._node.Node` is one acquisition's contender key (the rules it
follows are in :mod:`._recipe`). :meth:`Queue.advance` is the one step every
request takes: create the key under the client's lease if it has none, find
out whether it holds, and, when asked to wait, watch the one key (or range)
that blocks it until that is deleted, in the caller's task.

The Mutex keys a contender by its lease, so a client has one key per lock:
its tasks take turns for that key (:mod:`._turns`), first come first
served, and each turn creates the key anew.

Deleting a key is careful about one thing: a create that etcd may still
apply after its caller stopped waiting (a cancelled or timed-out request).
Such a create is sent with :meth:`EtcdClient.send`, so it runs to its answer
whatever happens to the caller, and :meth:`Queue.cleanup` waits for that
answer before it deletes; a create whose answer never came is swept once
more a request window later. A key left behind would block its lock for as
long as the client's lease lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..._errors import LockError
from ..._timing import Backoff
from .._background import Background, until_done
from ._client import EtcdClient
from ._errors import EtcdError, EtcdUnavailable
from ._node import Node
from ._replies import Created
from ._session import Session
from ._turns import Turns
from ._watch import Watch
from ._wire import Op

__all__ = ["Queue"]

logger = logging.getLogger("asynclock")

#: Why a request fails once the backend is closed.
CLOSED = "the etcd client is closed"


class Queue:
    """Contender keys of one client: creating, advancing, deleting (and the tasks' turns, :attr:`turns`)."""

    def __init__(self, client: EtcdClient, session: Session) -> None:
        self._client = client
        self._session = session
        #: the client's tasks' turns at its one key of a lock
        self.turns = Turns()
        self._waits: set[Watch] = set()
        #: the deletions of keys that could not be deleted in their caller's task
        self.tasks = Background()
        self.closed = False

    # -- advancing --------------------------------------------------------------------------

    async def advance(self, node: Node, *, wait: bool, until: float | None) -> bool:
        """Create ``node``'s key if it has none, and find out whether it holds; with ``wait``,
        watch what blocks it until it holds or the loop time ``until`` passes. True: it holds.

        A semaphore's node first takes its mutex, checks (``verify``) before its
        key is put, and lets the mutex go once it holds.
        """
        mutex = node.mutex
        if mutex is not None and not (mutex.held and mutex.alive):
            mutex.held = False
            if not await self._advance(mutex, wait=wait, until=until):
                return False
        if node.verify is not None and not node.has_key:
            await node.verify()
        holds = await self._advance(node, wait=wait, until=until)
        if holds and mutex is not None:
            node.mutex = None
            await self.let_go(mutex)
        return holds

    async def _advance(self, node: Node, *, wait: bool, until: float | None) -> bool:
        client = self._client
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise EtcdUnavailable(CLOSED)
            window = self._session.window()
            if not node.alive or node.revision == 0:
                first = await self._create(node, window)
                if first is True or (first is False and not wait):
                    if first and not await self._grant(node, window):
                        continue
                    return first
                if node.revision == 0:
                    continue
            contender = node.contender
            assert contender is not None
            check = await client.txn([], [Op.range(contender.key), contender.blocker(node.revision)], timeout=window)
            mine = check.range(0).kvs
            if not mine or mine[0].create_revision != node.revision:
                node.revision = 0  # our key went (the lease ended, or someone deleted it): queue again
                continue
            holds, blocker = contender.decide(check.range(1))
            if holds:
                if await self._grant(node, window):
                    return True
                continue
            if not wait or (until is not None and loop.time() >= until):
                return False
            assert blocker is not None
            key, range_end = blocker
            # A watch from now on: etcd reports its events at once. (One from a past
            # revision would be served by etcd's catch-up pass, every 100 ms.)
            watch = await client.watch(key, 0, window, range_end)
            self._waits.add(watch)
            try:
                if not await self._covers(watch, check.header.revision, node, blocker, window):
                    continue  # what blocks it changed meanwhile: look again
                left = None if until is None else until - loop.time()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await watch.fired.wait()
            finally:
                self._waits.discard(watch)
                if not watch.fired.is_set():
                    client.unwatch(watch)
            if watch.reason == "cancelled":
                return False  # ``until`` passed

    async def _covers(self, watch: Watch, seen: int, node: Node, blocker: tuple[bytes, bytes], window: float) -> bool:
        """Whether ``watch`` will report the deletion ``node`` waits for.

        The check that found ``blocker`` read etcd at revision ``seen``; the watch
        reports what happens after the revision etcd confirmed it at. If something
        was written in between, the blocker is read again: still blocking, its
        deletion comes later, so the watch sees it; gone or changed, look again.
        """
        try:
            async with asyncio.timeout(window):
                await watch.confirmed.wait()
        except TimeoutError:
            raise EtcdUnavailable(f"etcd at {self._client.current} did not confirm a watch in time") from None
        if watch.fired.is_set() or watch.revision <= seen:
            return True
        contender = node.contender
        assert contender is not None
        again = await self._client.range(contender.blocker(node.revision).body, window)
        holds, blocking = contender.decide(again)
        return not holds and blocking == blocker

    async def _create(self, node: Node, window: float) -> bool | None:
        """Put ``node``'s key under the current lease unless it exists; whether it holds
        (the Mutex reads the first contender in the same transaction), or None: ask."""
        session = self._session
        lease = session.usable()
        if lease is None:
            lease = await session.ensure(asyncio.get_running_loop().time() + window)
        if node.lease is not lease or node.contender is None:
            node.lease, node.revision, node.contender = lease, 0, node.make(lease.id)
        contender = node.contender
        sent = node.creating = self._client.send_txn(contender.create, timeout=window)
        node.uncertain = True
        try:
            created = Created.parse(await sent.answer())
        except EtcdUnavailable:
            node.creating = None  # no answer: it may still land (node.uncertain stays)
            raise
        except LockError as exc:
            node.creating = None
            node.uncertain = False  # refused: nothing was put
            if isinstance(exc, EtcdError) and "lease not found" in exc.details:
                self._session.gone(lease, "etcd no longer knows the lease", expired=True)
                return None
            raise
        node.creating = None
        node.uncertain = False
        if created.succeeded:
            node.revision = created.revision
        else:
            mine = created.first(0)
            if not mine:  # pragma: no cover - etcd answers a transaction at one revision
                return None
            node.revision = mine
        if not contender.reads_owner:
            return None
        owner = created.first(1)
        return not owner or owner == node.revision

    async def _grant(self, node: Node, window: float) -> bool:
        """``node`` holds by its rule: held, if its lease's confirmation is young enough to
        be trusted (confirmed again if need be); False: its lease is gone, queue again."""
        lease = node.lease
        if lease is not None and not lease.gone and not self._session.fresh_for(lease, node.ttl):
            await self._session.keepalive(lease, window)
        if lease is None or lease.gone:
            node.revision = 0
            return False
        node.held = True
        return True

    def lease_gone(self) -> None:
        """The lease went: every waiter reads again (and queues under the new one)."""
        for watch in list(self._waits):
            watch.fire("lost")

    # -- deleting -------------------------------------------------------------------------

    async def let_go(self, node: Node) -> None:
        """Delete ``node``'s key in the caller's task if that is quick; else (a create not
        answered yet, a failed request, a cancelled caller) in the background."""
        node.held = False
        if not node.has_key or self.closed:
            self.turns.pass_on(node)
            return
        if node.creating is not None or node.uncertain:
            self.finish_later(node)
            return
        assert node.contender is not None
        try:
            await self._client.remove(node.contender.remove, self._session.window())
        except BaseException as exc:
            self.finish_later(node)
            if not isinstance(exc, (LockError, OSError)):
                raise
            return
        self.turns.pass_on(node)

    def finish_later(self, node: Node) -> None:
        """Keep deleting ``node``'s key in the background until done or its lease ends."""
        if node.finisher is None or node.finisher.done():
            node.finisher = self.tasks.spawn(self.cleanup(node))

    async def cleanup(self, node: Node) -> None:
        """Delete ``node``'s key until done or moot (its lease is gone, or the client closed), then pass
        its turn on."""
        session = self._session

        def moot() -> bool:
            return self.closed or node.contender is None or not node.alive

        async def step() -> bool:
            assert node.contender is not None
            await self._client.remove(node.contender.remove, session.window())
            if not node.uncertain:
                return True
            # a create that failed unanswered may still be applied late: sweep once more, a window later
            node.uncertain = False
            await asyncio.sleep(session.window())
            return False

        try:
            sent = node.creating
            if sent is not None:
                # its answer (or its failure) first: then nothing can create the key behind us
                await sent.wait(session.granted)
                node.creating = None
                try:
                    await sent.answer()
                    node.uncertain = False
                except (LockError, OSError):
                    node.uncertain = True
            await until_done(step, moot=moot, backoff=Backoff(), retry=(EtcdUnavailable,))
        except LockError as exc:
            logger.warning("could not delete the etcd key of %r: %s", node.name, exc)
        finally:
            self.turns.pass_on(node)

    async def aclose(self) -> None:
        """Stop: waiters see the client closed; clean-ups are moot (the lease is revoked)."""
        self.closed = True
        self.lease_gone()
        self.tasks.cancel()
        await self.tasks.aclose(within=self._session.window())
