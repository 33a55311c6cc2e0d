"""ZooKeeper (``zk://host:port,host:port/optional/chroot``): a Curator-compatible lock recipe.

Layout: the lock ``name`` is the znode ``<chroot>/<prefix>/<name>`` (both
escaped by :func:`escape_name`, so every distinct name is a distinct valid
znode). Each acquisition creates one ephemeral sequential child
``_c_<guid>-lock-<seq>`` under it, named like Curator's protected mode.

Recipe: every child whose name ends in a 10-digit sequence number is a
contender, whoever wrote it (Curator ``_c_…-lock-N``, kazoo ``…__lock__N``),
ordered by that number. The lowest holds; every other contender watches only
its immediate predecessor (no herd). When that one goes and it was the only
contender ahead, the waiter holds at once (a node is never created ahead of
an existing one: the sequence only grows); otherwise it re-reads the
children, as it does after any reconnect (watches belong to a connection). A create whose
answer was lost with the connection is resolved by looking for the GUID among
the children (and checking the node's ephemeralOwner is our session), never by
creating blindly again. A waiter that gives up (timeout, cancellation, error)
deletes its node, in the background if the server cannot be reached now.

Lease: the session. The trusted deadline is the send time of the last request
of the session the server answered, plus the negotiated session timeout, minus
a margin (:meth:`ZooKeeperBackend.lease_time`): the server cannot expire the
session before then. While this client holds a lock, the lease watchdog's
renewals (one pipelined ``exists`` per held node, one round trip) are the
session's only heartbeat, so a client whose watchdog stalls lets its session,
and its locks, go, as a Redis key would expire. The holder's own node is
watched from its first renewal on (the watch rides on that renewal's
``exists``, so a free lock costs a create, with the children read pipelined
behind it, and a delete): deleting it (an administrator, or the session
expiring) loses the lease at once; before that first renewal, a deletion is
found by the renewal itself.

Fencing token: the czxid of the holder's node. zxids increase with every
transaction of the ensemble, across leader changes (the epoch is the high
32 bits), and a holder's node was created after every node that held that
lock before it (the lowest sequence number holds, and the sequence follows
creation order), so each new holder of a name gets a larger czxid, even when
the lock's parent znode was deleted and created again in between.

Reentrancy is counted in the client: a re-entry writes nothing.

More primitives (:class:`_ZkPrimitive`), each on Curator's layout so that
Curator's recipes share them: the fair lock is the lock itself (the recipe is
FIFO); a read-write lock is Curator's InterProcessReadWriteLock under
``<prefix>/%rw/<name>``; a semaphore is Curator's InterProcessSemaphoreV2
under ``<prefix>/%semaphore/<name>``. Every token is a node's czxid. A
semaphore's lease node holds the permits its client asked for (Curator ignores
lease data), and a client that asks for another number than the leases
already there gets ValueError from its acquire, before it waits.

Configuration: the chroot must exist (ConfigurationError otherwise, when the
client starts); ``zk://user:password@…`` sends digest credentials on every
connection, and the nodes the client creates then carry the creator's ACL; a
request the ACL refuses (NoAuth) raises ConfigurationError. The lock ttl and
the session timeout are chosen together before any I/O (the ttl follows a
given session timeout; a ttl the session cannot carry is refused,
:func:`max_ttl`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote

try:
    from aiozk import protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ZooKeeper backend needs aiozk: pip install 'asynclock[zookeeper]'") from exc

from ..._errors import ConfigurationError, LockError
from ..._legacy import LOCK, Shape
from ..._legacy import LegacyBackend as Backend
from ..._legacy import legacy_unsupported as unsupported
from ..._options import DEFAULT_CONNECT_TIMEOUT, reject_unknown, seconds
from ..._values import LockInfo
from ...abc import Acquired, BackendHooks, Busy, RenewItem
from ._layout import (
    DEFAULT_TTL,
    LEASE_BASE,
    OPTIONS,
    PROTECTED,
    READ,
    RESERVED,
    RW_DIR,
    SEM_DIR,
    SEM_LEASES,
    SEM_LOCKS,
    WRITE,
    credentials,
    escape_name,
    lease_time_of,
    max_ttl,
    parse_url,
    permits_data,
    permits_of,
    ttl_refused,
)
from ._recipe import Node, Rule, Verify, contenders_of, first_holds, reader_holds, rw_holders
from ._session import WatchCallback, ZkSession
from ._wire import (
    CONTAINER,
    CREATOR_ACL,
    EPHEMERAL,
    NO_NODE,
    NODE_EXISTS,
    OPEN_ACL,
    SEQUENTIAL,
    ZkConnectionLoss,
    ZkError,
    children_request,
    create_request,
    delete_request,
    exists_request,
)

__all__ = ["ZooKeeperBackend", "credentials", "escape_name", "max_ttl", "parse_url"]

logger = logging.getLogger("asynclock")


class ZooKeeperBackend:
    """Locks on a ZooKeeper ensemble; the lease is the session.

    ``session_timeout`` (seconds; default the client's ``ttl``) is what we ask
    for; the server clamps it to its bounds (by default 2 to 20 ticks) and the
    negotiated value is used. ``connect_timeout`` bounds the first connection.
    ``ttl`` is the client's default lock ttl, checked against the session
    (:func:`max_ttl`). ``auth`` = (scheme, credentials), e.g. ``("digest",
    b"user:password")``, is sent on every connection, and the nodes this
    client creates then carry ZooKeeper's creator ACL (every right for the
    identities it authenticated as), so the ACL of a chroot extends to them.
    The chroot must exist.
    """

    kind = "zookeeper"
    queues_waiters = True

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        chroot: str = "",
        prefix: str = "asynclock",
        session_timeout: float = DEFAULT_TTL,
        connect_timeout: float | None = None,
        ttl: float | None = None,
        auth: tuple[str, bytes] | None = None,
    ) -> None:
        self._ttl = session_timeout if ttl is None else ttl
        if self._ttl >= max_ttl(session_timeout):
            raise ValueError(ttl_refused(self._ttl, session_timeout))
        self._chroot = chroot
        self._chroot_checked = not chroot
        self._base = f"{chroot}/{escape_name(prefix)}"
        self._acl = OPEN_ACL if auth is None else CREATOR_ACL
        self._session = ZkSession(
            hosts,
            timeout=session_timeout,
            on_connected=self._on_connected,
            on_expired=self._on_expired,
            keepalive=self._keepalive,
            auth=() if auth is None else [auth],
        )
        self._connect_timeout = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self._nodes: dict[str, Node] = {}
        self._hooks: BackendHooks | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "asynclock", ttl: float | None = None, **options: Any
    ) -> ZooKeeperBackend:
        """A backend for ``zk://[user:password@]h1:p1,h2:p2/optional/chroot?session_timeout=S``.

        The lease is the session, so the lock ttl and the session timeout are
        chosen together, here, before any I/O:

        * neither given: both 30 s;
        * only ``ttl``: the session timeout is the ttl;
        * only ``session_timeout``: the ttl follows it (:attr:`ttl`);
        * both: the ttl must stay under :func:`max_ttl` of the session timeout
          (about twice it), else ValueError.

        Unknown options raise ValueError naming the valid ones.
        """
        hosts, chroot, query = parse_url(url)
        reject_unknown([*query, *options], OPTIONS, "zk://")
        merged: dict[str, Any] = {**query, **options}
        asked = merged.pop("session_timeout", None)
        session_timeout = seconds(asked, "session_timeout") if asked is not None else None
        connect = merged.pop("connect_timeout", None)
        connect_timeout = None if connect is None else seconds(connect, "connect_timeout")
        if session_timeout is None:
            session_timeout = DEFAULT_TTL if ttl is None else ttl
        return cls(
            hosts,
            chroot=chroot,
            prefix=prefix,
            session_timeout=session_timeout,
            connect_timeout=connect_timeout,
            ttl=ttl,
            auth=credentials(url),
        )

    @property
    def ttl(self) -> float:
        """The client's default lock ttl (the session timeout unless one was given)."""
        return self._ttl

    def check_ttl(self, ttl: float) -> None:
        """ValueError if a lock's ``ttl`` is too long for the session (the negotiated one once connected)."""
        if ttl >= max_ttl(self._session.timeout):
            raise ValueError(ttl_refused(ttl, self._session.timeout))

    @property
    def session(self) -> ZkSession:
        """The ZooKeeper session (for tests and tools)."""
        return self._session

    # -- protocol ---------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        return f"{self._base}/{escape_name(name)}"

    def primitive(self, shape: Shape) -> Backend:
        """The plain lock (itself), the fair lock (the same recipe and path), either
        side of a read-write lock, or a semaphore; all on this session."""
        if shape == LOCK:
            return self
        return _ZkPrimitive(self, shape)

    def lease_time(self, ttl: float) -> float:
        """The negotiated session timeout less a 10 % (+5 ms) margin, whatever the ttl."""
        return lease_time_of(self._session.timeout)

    async def start(self, hooks: BackendHooks) -> None:
        """Connect; check the negotiated session against the ttl, and that the chroot exists.

        Raises BackendUnavailable when no server could be reached within the
        connect timeout (at once when every server refused the connection or
        has no address), ConfigurationError when the server's session timeout
        cannot carry the client's ttl or the chroot does not exist.
        """
        self._hooks = hooks
        session = self._session
        await session.start(self._connect_timeout)
        if self._ttl >= max_ttl(session.timeout):
            raise ConfigurationError(
                f"ZooKeeper at {session.address} gave a session timeout of {session.timeout:g} s for the"
                f" {session.requested_timeout:g} s asked (its minSessionTimeout/maxSessionTimeout): "
                + ttl_refused(self._ttl, session.timeout)
            )
        if not self._chroot_checked:
            try:
                await session.call(exists_request(self._chroot), self._chroot)
            except ZkError as exc:
                if exc.code == NO_NODE:
                    raise self._no_chroot() from exc
                raise
            self._chroot_checked = True

    def _no_chroot(self) -> ConfigurationError:
        return ConfigurationError(
            f"ZooKeeper at {self._session.address}: the chroot {self._chroot} does not exist; create it"
            " (asynclock creates only what is under it) or leave it out of the URL"
        )

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        raise NotImplementedError("ZooKeeper queues waiters: the front calls wait_acquire")

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        node = Node(name, hold, self.lock_key(name), str(uuid.uuid4()))
        return await self._acquire(node, ttl, timeout, first_holds)

    def _check_ttl(self, ttl: float) -> None:
        # (lock() checks a lock's ttl already; the negotiated session may be shorter than asked)
        self.check_ttl(ttl)

    async def _acquire(
        self,
        node: Node,
        ttl: float,
        timeout: float | None,
        rule: Rule,
        mutex: Node | None = None,
        verify: Verify | None = None,
    ) -> Acquired | None:
        """Queue ``node`` (its hold's node) until ``rule`` says it holds, or give up and delete it.

        With a ``mutex`` (the semaphore's), ``node`` is created only once the
        mutex is held, and the mutex is let go as soon as ``node`` holds.
        ``verify`` sees the queue once ``node`` is in it, and may refuse it by
        raising (the nodes are deleted then).
        """
        self._check_ttl(ttl)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        once = timeout == 0
        self._nodes[node.hold] = node
        try:
            try:
                # the deadline bounds every step, a create or a read included
                # (timeout=0 still makes its one try: create, read, delete)
                async with asyncio.timeout_at(None if once else deadline):
                    if mutex is not None and await self._queue(mutex, deadline, once=once, rule=first_holds) is None:
                        result = None
                    else:
                        result = await self._queue(
                            node, deadline, once=once, rule=rule, watch_children=bool(mutex), verify=verify
                        )
            except TimeoutError:
                if deadline is None or once or loop.time() < deadline:
                    raise
                if not self._session.connected:
                    raise ZkConnectionLoss(
                        f"no ZooKeeper server of {self._session.address} reachable within {timeout:.3g} s"
                    ) from None
                result = None
            if result is not None and mutex is not None:
                # the next waiter's turn, before this acquire returns (so an
                # acquire(timeout=0) made after it never finds the mutex taken)
                await self._abandon(mutex)
        except BaseException:
            await self._abandon(node, mutex)
            raise
        if result is None:
            await self._abandon(node, mutex)
        return result

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        node = self._nodes.get(hold)
        if node is None or not self._alive(node):
            return False
        node.count = count
        return True

    async def release(self, name: str, hold: str) -> bool:
        """Delete the hold's node; on trouble it is deleted in the background and this raises.

        Waits at most a third of the session timeout for a connection (and a
        request is given up after as long without an answer), so it never
        blocks for long; the background deletion goes on until it succeeds or
        the session ends, so no node outlives its release while the session lives.
        """
        node = self._nodes.get(hold)
        if node is None:
            return False
        session = self._session
        if not self._alive(node) or self._closed:
            # the session is known to be over (expired or closed): so are its nodes.
            # Past its timeout is not enough: until the server has expired it, any
            # request (a ping) revives it, and the node would then stay forever.
            self._forget(node)
            return False
        node.releasing = True
        if node.path is None or node.uncertain:
            # never settled (a cancelled acquire): remove whatever carries its GUID
            self._forget(node)
            self._spawn(self._cleanup(node))
            return False
        try:
            await session.wait_connected(self._op_timeout())
            await session.call(delete_request(node.path), node.path)
        except ZkError as exc:
            if exc.code != NO_NODE:
                self._finish_later(node)
                raise
            self._forget(node)
            return node.delete_sent and node.held  # an earlier, unanswered delete did it
        except BaseException:
            node.delete_sent = True
            self._finish_later(node)
            raise
        self._forget(node)
        return node.held

    def _finish_later(self, node: Node) -> None:
        """Keep deleting a released node in the background until done or its session ends."""
        if node.finisher is None or node.finisher.done():
            node.finisher = self._spawn(self._finish_release(node))

    async def _finish_release(self, node: Node) -> None:
        await self._cleanup(node)
        self._forget(node)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One pipelined ``exists`` per held node, sent now: True if it is still ours."""
        session = self._session
        await session.wait_connected(None)  # the watchdog bounds this call
        sid = session.session_id
        futures: list[asyncio.Future[Any] | None] = []
        for item in items:
            node = self._nodes.get(item.hold)
            if node is None or not self._alive(node) or node.path is None:
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

    async def subscribe(self, name: str) -> None:
        """Nothing to do: waiters watch their predecessor node."""

    async def unsubscribe(self, name: str) -> None:
        """Nothing to do: waiters watch their predecessor node."""

    async def info(self, name: str) -> LockInfo:
        return await self._describe(name, self.lock_key(name))

    async def _check_permits(self, name: str, leases: str, others: list[str], permits: int) -> None:
        """ValueError if the semaphore's other leases were taken with another number of permits.

        Runs while this client holds the semaphore's mutex, so every lease
        was checked against those before it when it was made: the first one
        that says how many permits its client asked for speaks for them all.
        Leases that say nothing (Curator's) are skipped.
        """
        session = self._session
        for child in others:
            path = f"{leases}/{child}"
            try:
                reply = await session.call(protocol.GetDataRequest(path=path, watch=False), path)
            except ZkError as exc:
                if exc.code == NO_NODE:
                    continue  # released meanwhile
                raise
            theirs = permits_of(reply.data)
            if theirs is None:
                continue
            if theirs != permits:
                raise ValueError(
                    f"semaphore {name!r} is held or awaited with permits={theirs} by other clients;"
                    f" this one asks for permits={permits}: every client of a semaphore must use the same number"
                )
            return

    async def _children(self, path: str) -> list[str]:
        """The contenders among the children of ``path``, in order ([] if it does not exist)."""
        try:
            reply = await self._session.call(children_request(path), path)
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            return []
        return contenders_of(reply.children)

    async def _describe(
        self,
        name: str,
        key: str,
        nodes: str | None = None,
        pick: Callable[[list[str]], list[str]] = lambda contenders: contenders[:1],
        queue: str | None = None,
    ) -> LockInfo:
        """What the server says: the contenders under ``nodes`` (default ``key``), of
        which ``pick`` holds; the waiters are the other contenders, or those under ``queue``."""
        session = self._session
        nodes = nodes or key
        await session.wait_connected(self._op_timeout())
        contenders = await self._children(nodes)
        while True:
            holders = pick(contenders)
            if not holders:
                break
            first = f"{nodes}/{holders[0]}"
            try:
                stat = await session.call(exists_request(first), first)
            except ZkError as exc:
                if exc.code != NO_NODE:
                    raise
                contenders.remove(holders[0])  # released meanwhile: look again
                continue
            break
        waiters = len(contenders) - len(holders) if queue is None else len(await self._children(queue))
        if not holders:
            return LockInfo(name=name, key=key, owner=None, hold_count=0, ttl=None, waiters=waiters, token=None)
        ours = {node.path: node for node in self._nodes.values() if node.held and node.path is not None}
        ids = tuple(ours[f"{nodes}/{h}"].hold if f"{nodes}/{h}" in ours else h for h in holders)
        mine = ours.get(first)
        return LockInfo(
            name=name,
            key=key,
            owner=ids[0],
            hold_count=mine.count if mine is not None else 1,
            ttl=session.timeout if mine is not None else None,
            waiters=waiters,
            token=int(stat.stat.created_zxid),
            holders=ids,
        )

    async def names(self) -> list[str]:
        """Lock names under this client's prefix that have contenders now."""
        session = self._session
        await session.wait_connected(self._op_timeout())
        try:
            reply = await session.call(children_request(self._base), self._base)
        except ZkError as exc:
            if exc.code == NO_NODE:
                return []
            raise
        return sorted(unquote(child, errors="strict") for child in reply.children if child not in RESERVED)

    async def aclose(self) -> None:
        """Close the session (the server deletes our nodes at once), bounded in time."""
        if self._closed:
            return
        self._closed = True
        await self._session.close(min(1.0, self._session.timeout / 2))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)

    # -- the recipe ----------------------------------------------------------------

    def _op_timeout(self) -> float:
        """How long a single operation waits for a connection before failing."""
        return max(0.05, self._session.timeout / 3)

    def _alive(self, node: Node) -> bool:
        return not node.gone and (node.session == 0 or node.session == self._session.session_id)

    def _keepalive(self) -> bool:
        # While we hold a lock the watchdog's renewals are the heartbeat.
        return not any(node.held and not node.releasing and not node.gone for node in self._nodes.values())

    def _forget(self, node: Node) -> None:
        if self._nodes.get(node.hold) is node:
            del self._nodes[node.hold]

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _wait_connected(self, deadline: float | None) -> None:
        """Wait for a connection: until ``deadline``, and never longer than one session timeout."""
        loop = asyncio.get_running_loop()
        limit = self._session.timeout
        if deadline is not None:
            limit = min(limit, max(0.0, deadline - loop.time()))
        await self._session.wait_connected(limit)

    async def _queue(
        self,
        node: Node,
        deadline: float | None,
        *,
        once: bool,
        rule: Rule,
        watch_children: bool = False,
        verify: Verify | None = None,
    ) -> Acquired | None:
        """Create our node and wait until ``rule`` says it holds.

        A waiter watches the node ``rule`` names; with ``watch_children`` (the
        semaphore's leases, watched by the one waiter that holds the
        semaphore's mutex) it watches the children instead: once it has to
        wait, every read of the children sets that watch in the same request
        (a hold granted at once sets none).
        """
        session = self._session
        loop = asyncio.get_running_loop()
        waiting = False
        while True:
            if self._closed:
                raise ZkConnectionLoss("the ZooKeeper client is closed")
            woken = asyncio.Event()
            news: list[str] = []

            def wake(what: str, woken: asyncio.Event = woken, news: list[str] = news) -> None:
                news.append(what)
                woken.set()

            child_watch = wake if watch_children and waiting else None
            watched: tuple[str, str] | None = ("child", node.dir) if child_watch else None
            try:
                listing: asyncio.Future[Any] | None = None
                if node.path is None or not self._alive(node):
                    node.path, node.gone = None, False
                    # the children are read in the same write as the create: the
                    # server answers a session's requests in order, so the list
                    # has our node in it (one round trip when the lock is free)
                    listing = await self._create(node, deadline, child_watch)
                    assert node.path is not None
                try:
                    if listing is None:
                        await self._wait_connected(deadline)
                        listing = self._list(node.dir, child_watch)
                    reply = await listing
                except ZkConnectionLoss:
                    continue  # re-read after the reconnect
                except ZkError as exc:
                    if exc.code != NO_NODE:
                        raise
                    node.path = None
                    continue
                contenders = contenders_of(reply.children)
                mine = node.path.rsplit("/", 1)[1]
                if mine not in contenders:
                    node.path = None  # deleted under us (expired session, administrator): queue again
                    continue
                for twin in contenders:
                    if node.guid in twin and twin != mine:  # a duplicate create: never ours to keep
                        self._spawn(self._delete_quietly(f"{node.dir}/{twin}"))
                if verify is not None:
                    try:
                        await verify(contenders, mine)
                    except ZkConnectionLoss:
                        continue  # look again after the reconnect
                    verify = None
                holds, ahead = rule(contenders, mine)
                if holds:
                    # the deletion watch on our node is set by the first renewal
                    # (in the same request), so a free lock costs create + delete
                    node.held = True
                    return Acquired(node.czxid, confirmed_at=session.confirmed_at)
                if once:
                    return None
                if watch_children and child_watch is None:
                    waiting = True
                    continue  # read them again, with the watch this time
                if ahead is not None and not watch_children:
                    predecessor = f"{node.dir}/{ahead}"
                    watched = ("data", predecessor)
                    try:
                        await session.call(
                            protocol.GetDataRequest(path=predecessor, watch=True), predecessor, watch=("data", wake)
                        )
                    except ZkConnectionLoss:
                        continue
                    except ZkError as exc:
                        if exc.code != NO_NODE:
                            raise
                        continue  # gone already: read the children again
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return None
                try:
                    async with asyncio.timeout(remaining):
                        await woken.wait()
                except TimeoutError:
                    return None
                if ahead is not None and not watch_children and news[:1] == ["deleted"]:
                    # Nodes are never created ahead of an existing one (the
                    # sequence only grows), so if the rule holds without the
                    # node that went, it holds now: no need to read again.
                    holds, _ = rule([child for child in contenders if child != ahead], mine)
                    if holds and self._alive(node) and session.connected:
                        node.held = True
                        return Acquired(node.czxid, confirmed_at=session.confirmed_at)
            finally:
                if watched is not None:
                    session.unwatch(*watched, wake)

    def _list(self, path: str, watch: WatchCallback | None = None) -> asyncio.Future[Any]:
        """Send a getChildren of ``path`` now (with a children watch calling ``watch``)."""
        request = children_request(path, watch=watch is not None)
        return self._session.submit(request, path, watch=None if watch is None else ("child", watch))

    async def _create(
        self, node: Node, deadline: float | None, watch: WatchCallback | None = None
    ) -> asyncio.Future[Any] | None:
        """Create our contender node, once, even across connection losses.

        Returns the answer to a getChildren (with a children watch calling
        ``watch``) sent right behind the create, or None when the node was
        found after a lost create answer.
        """
        session = self._session
        base = f"{node.dir}/{PROTECTED}{node.guid}{node.base}"
        missing_parents = 0
        while True:
            await self._wait_connected(deadline)
            if node.uncertain and await self._adopt(node):
                return None
            node.session = session.session_id
            node.uncertain = True
            request = create_request(base, EPHEMERAL | SEQUENTIAL, data=node.data, acl=self._acl)
            future = node.create_future = session.submit(request, base)
            listing: asyncio.Future[Any] | None = None
            with contextlib.suppress(ZkConnectionLoss):  # the create's own answer tells
                listing = self._list(node.dir, watch)
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
                continue  # did it happen? _adopt finds out after the reconnect
            except ZkError as exc:
                node.uncertain = False
                if exc.code == NO_NODE and missing_parents < 3:
                    missing_parents += 1
                    await self._ensure_parents(node.dir)
                    continue
                raise
            node.uncertain = False
            node.path = str(reply.path)
            node.czxid = int(reply.stat.created_zxid)
            return listing

    async def _adopt(self, node: Node) -> bool:
        """After a lost create answer: find our node by its GUID; keep it if this session owns it."""
        session = self._session
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
                await self._delete_quietly(path)
        node.uncertain = False
        return adopted

    async def _ensure_parents(self, path: str) -> None:
        """Create our prefix and lock znodes (containers) under the chroot, which must exist."""
        session = self._session
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

    async def _delete_quietly(self, path: str) -> None:
        with contextlib.suppress(LockError):
            await self._session.call(delete_request(path), path)

    async def _abandon(self, *nodes: Node | None) -> None:
        """Leave the queue: delete our nodes, waiting a bounded time (then it goes on in the background)."""
        tasks = []
        for node in nodes:
            if node is not None:
                self._forget(node)
                node.held = False
                tasks.append(self._spawn(self._cleanup(node)))
        if not self._session.connected:
            return  # nothing can be deleted now: the clean-up goes on once reconnected
        with contextlib.suppress(TimeoutError, LockError):
            async with asyncio.timeout(self._session.timeout):
                await asyncio.shield(asyncio.gather(*tasks))

    async def _cleanup(self, node: Node) -> None:
        """Delete ``node`` (by path, or by GUID if its create is unsettled); retried until done or moot."""
        session = self._session
        delay = 0.02
        while not self._closed:
            if node.session and node.session != session.session_id:
                return  # its session is gone, and every ephemeral node of it
            future = node.create_future
            if future is not None and not future.done():
                with contextlib.suppress(LockError):
                    await asyncio.shield(future)
            if future is not None and future.done() and not future.cancelled() and future.exception() is None:
                node.path, node.uncertain = str(future.result().path), False
            if not node.uncertain and node.path is None:
                return  # nothing was created: no need to wait for a connection
            try:
                await session.wait_connected(None)
                if node.session and node.session != session.session_id:
                    return
                if node.path is not None and not node.uncertain:
                    await self._delete_quietly(node.path)
                    if not session.connected:
                        raise ZkConnectionLoss("disconnected during delete")
                    return
                reply = await session.call(children_request(node.dir), node.dir)
                for child in reply.children:
                    if node.guid in child:
                        await self._delete_quietly(f"{node.dir}/{child}")
                if session.connected:
                    return
            except ZkConnectionLoss:
                pass
            except ZkError as exc:
                if exc.code == NO_NODE:
                    return
                logger.warning("could not delete the ZooKeeper node of %r: %s", node.name, exc)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _arm(self, node: Node) -> None:
        """Watch a held node: its deletion loses the lease at once."""
        if node.path is None or node.armed == self._session.connection_seq:
            return
        node.armed = self._session.connection_seq
        self._spawn(self._watch_held(node))

    def _held_watch(self, node: Node) -> WatchCallback:
        """The callback of a held node's deletion watch."""

        def fired(what: str) -> None:
            node.armed = -1
            if what != "disconnected" and not self._closed:
                self._arm(node)  # read it again: deleted, or just changed?

        return fired

    async def _watch_held(self, node: Node) -> None:
        session = self._session
        if self._nodes.get(node.hold) is not node or not node.held or node.releasing or node.path is None:
            return
        try:
            await session.call(
                protocol.GetDataRequest(path=node.path, watch=True), node.path, watch=("data", self._held_watch(node))
            )
        except ZkConnectionLoss:
            node.armed = -1  # armed again after the reconnect
        except ZkError as exc:
            if exc.code == NO_NODE:
                self._node_gone(node, "the lock node was deleted (removed on the server, or the session ended)")

    def _node_gone(self, node: Node, reason: str) -> None:
        if self._nodes.get(node.hold) is not node or not node.held or node.releasing or node.gone:
            return
        node.gone = True
        if self._hooks is not None:
            self._hooks.lose([node.hold], reason)

    def _on_connected(self) -> None:
        if self._closed:
            return
        sid = self._session.session_id
        for node in list(self._nodes.values()):
            if node.held and not node.gone and node.session == sid:
                self._arm(node)

    def _on_expired(self, old_session: int) -> None:
        lost = []
        for node in self._nodes.values():
            if node.session == old_session and not node.gone:
                node.gone = True
                if node.held and not node.releasing:
                    lost.append(node.hold)
        if lost and self._hooks is not None:
            self._hooks.lose(lost, "the ZooKeeper session expired")


class _ZkPrimitive:
    """The adapter of a fair lock, a read or write side, or a semaphore, on its backend's session.

    Its holds live in the backend's table (hold ids are unique across
    shapes), so renewals, session loss and the deletion watches work the same
    for every shape; this object only knows its layout.

    * ``fair``: the plain lock's recipe and path (it is FIFO already), so a
      fair lock and a plain lock of one name exclude each other, and
      Curator's InterProcessMutex on that path takes part.
    * ``read`` / ``write``: Curator's InterProcessReadWriteLock under
      ``<prefix>/%rw/<name>``: ``_c_<guid>-__READ__<seq>`` and
      ``_c_<guid>-__WRIT__<seq>`` nodes in one sequence. A writer holds when
      its node is the lowest and watches the node just ahead; a reader holds
      when no writer node is ahead of it and watches the nearest writer ahead.
      So a waiting writer keeps later readers out. The token is the node's
      czxid, one counter for both sides.
    * ``semaphore``: Curator's InterProcessSemaphoreV2 under
      ``<prefix>/%semaphore/<name>``: take the mutex ``locks`` (the lock
      recipe), create ``leases/_c_<guid>-lease-<seq>``, and hold once it is
      one of the first ``permits`` leases, waiting meanwhile on a children
      watch of ``leases`` (only the mutex holder waits there, so no herd);
      then let the mutex go. The token is the lease node's czxid.
    """

    queues_waiters = True

    def __init__(self, backend: ZooKeeperBackend, shape: Shape) -> None:
        self._backend = backend
        self._shape = shape
        self.kind = backend.kind
        self._hooks: BackendHooks | None = None

    def __repr__(self) -> str:
        return f"<ZooKeeper {self._shape.kind} adapter>"

    def lock_key(self, name: str) -> str:
        backend = self._backend
        kind = self._shape.kind
        if kind == "fair":
            return backend.lock_key(name)
        family = RW_DIR if kind in ("read", "write") else SEM_DIR
        return f"{backend._base}/{family}/{escape_name(name)}"

    def lease_time(self, ttl: float) -> float:
        return self._backend.lease_time(ttl)

    def primitive(self, shape: Shape) -> Backend:
        raise unsupported(self.kind, shape, "ask the backend, not one of its adapters")

    async def start(self, hooks: BackendHooks) -> None:
        """Waiters watch nodes, so the hooks only ever hear of losses (through the backend)."""
        self._hooks = hooks
        await self._backend._session.wait_connected(self._backend._connect_timeout)

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        raise NotImplementedError("ZooKeeper queues waiters: the front calls wait_acquire")

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        backend = self._backend
        kind = self._shape.kind
        path = self.lock_key(name)
        guid = str(uuid.uuid4())
        if kind == "fair":
            return await backend._acquire(Node(name, hold, path, guid), ttl, timeout, first_holds)
        if kind == "write":
            return await backend._acquire(Node(name, hold, path, guid, base=f"-{WRITE}"), ttl, timeout, first_holds)
        if kind == "read":
            return await backend._acquire(Node(name, hold, path, guid, base=f"-{READ}"), ttl, timeout, reader_holds)
        permits = self._shape.permits

        def first_permits(contenders: list[str], mine: str) -> tuple[bool, str | None]:
            return contenders.index(mine) < permits, None

        leases = f"{path}/{SEM_LEASES}"
        lease = Node(name, hold, leases, guid, base=LEASE_BASE, data=permits_data(permits))

        async def same_permits(contenders: list[str], mine: str) -> None:
            await backend._check_permits(name, leases, [child for child in contenders if child != mine], permits)

        mutex = Node(name, hold, f"{path}/{SEM_LOCKS}", str(uuid.uuid4()))
        return await backend._acquire(lease, ttl, timeout, first_permits, mutex, verify=same_permits)

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        return await self._backend.set_count(name, hold, count, ttl)

    async def release(self, name: str, hold: str) -> bool:
        return await self._backend.release(name, hold)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return await self._backend.renew(items)

    async def subscribe(self, name: str) -> None:
        """Nothing to do: waiters watch nodes."""

    async def unsubscribe(self, name: str) -> None:
        """Nothing to do: waiters watch nodes."""

    async def info(self, name: str) -> LockInfo:
        backend = self._backend
        kind = self._shape.kind
        key = self.lock_key(name)
        if kind == "fair":
            return await backend._describe(name, key)
        if kind in ("read", "write"):
            return await backend._describe(name, key, pick=rw_holders)
        permits = self._shape.permits
        return await backend._describe(
            name,
            key,
            nodes=f"{key}/{SEM_LEASES}",
            pick=lambda contenders: contenders[:permits],
            queue=f"{key}/{SEM_LOCKS}",
        )

    async def aclose(self) -> None:
        """Nothing of its own: the backend closes the session."""
