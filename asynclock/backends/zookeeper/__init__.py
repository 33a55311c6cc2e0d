"""ZooKeeper (``zk://host:port,host:port/optional/chroot``): Curator-compatible lock recipes.

One acquisition is one ephemeral sequential node, named like Curator's
protected mode (``_c_<guid>-lock-<seq>``), under the lock's znode
(:mod:`._layout`); the contender rules are in :mod:`._order`, each
primitive's node in :mod:`._primitives`, the queue in :mod:`._recipe`,
creating and deleting nodes in :mod:`._nodes`; the session, on aiozk's wire
format with our own life cycle, in :mod:`._session`; the holds, their lease
and their release in :mod:`._holds`.

Requests: ``try_acquire`` creates the hold's node and reads the contenders
in the same round trip: held, or queued (the node stays), or (not queueing)
the node is deleted and the answer is Busy. ``wait_queued`` watches the
predecessor in the caller's task until granted. A cancelled request may
still be applied by the server (a create that lands after the cancel), so
``release`` finds a hold's node by its GUID (checking its ephemeralOwner)
and deletes it, as it deletes a queued or held one.

Lease: the session (:meth:`ZooKeeperBackend.lease_time`). Fencing token:
the czxid of the holder's node. zxids increase with every transaction of the
ensemble, across leader changes (the epoch is the high 32 bits), and a
holder's node was created after every node that held that lock before it
(the lowest sequence number holds, and the sequence follows creation order),
so each new holder of a name gets a larger czxid, even when the lock's
parent znode was deleted and created again in between. Reentrancy is
counted in the client: a re-entry writes nothing.

Primitives, each on Curator's layout so that Curator's recipes share them:

* the fair lock is the plain lock (the recipe is FIFO): one path, one hold;
* a read-write lock is Curator's InterProcessReadWriteLock under
  ``<prefix>/%rw/<name>``: ``…-__READ__<seq>`` and ``…-__WRIT__<seq>``
  nodes in one sequence. A writer holds when its node is the lowest; a
  reader when no writer node is ahead of it (it watches the nearest writer
  ahead), so a waiting writer keeps later readers out;
* an election is Curator's LeaderLatch under ``<prefix>/%election/<name>``:
  a candidate is a lock contender named ``_c_<guid>-latch-<seq>`` whose data
  is its identity; the lowest leads (:mod:`._election` reads who that is);
* a semaphore is Curator's InterProcessSemaphoreV2 under
  ``<prefix>/%semaphore/<name>``: take the mutex ``locks`` (the lock
  recipe), create ``leases/_c_<guid>-lease-<seq>``, and hold once it is one
  of the first ``permits`` leases, waiting meanwhile on a children watch of
  ``leases``; then let the mutex go. A lease node holds the permits its
  client asked for (Curator ignores lease data), and a client that asks for
  another number than the leases already there gets ValueError from its
  acquire, before it waits.

Configuration: the chroot must exist (ConfigurationError otherwise, when the
client starts); ``zk://user:password@…`` sends digest credentials on every
connection, and the nodes the client creates then carry the creator's ACL; a
request the ACL refuses (NoAuth) raises ConfigurationError. The lock ttl and
the session timeout are chosen together before any I/O (the ttl follows a
given session timeout; a ttl the session cannot carry is refused,
:func:`max_ttl`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._errors import ConfigurationError
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, reject_unknown, seconds
from ..._timing import request_window
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from ._breaking import break_holder
from ._describe import describe, lock_names
from ._election import ZkLeaderWatch, read_leader
from ._holds import Holds
from ._layout import (
    DEFAULT_TTL,
    OPTIONS,
    Layout,
    credentials,
    escape_name,
    lease_time_of,
    max_ttl,
    parse_url,
    ttl_refused,
)
from ._nodes import Node, Nodes
from ._primitives import node_for
from ._recipe import Recipe
from ._session import ZkSession
from ._wire import CREATOR_ACL, NO_NODE, OPEN_ACL, ZkError, edge, exists_request

__all__ = ["ZooKeeperBackend", "credentials", "escape_name", "max_ttl", "parse_url"]


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

    scheme = "zookeeper"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["zookeeper"].words

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
        self._layout = Layout(chroot, prefix)
        self._chroot_checked = not chroot
        self._session = ZkSession(
            hosts,
            timeout=session_timeout,
            on_connected=lambda: self._holds.on_connected(),
            on_expired=lambda sid: self._holds.on_expired(sid),
            on_disconnected=lambda reason: self._holds.on_disconnected(reason),
            keepalive=lambda: self._holds.keepalive(),
            auth=() if auth is None else [auth],
        )
        self._nodes = Nodes(
            self._session, chroot=chroot, acl=OPEN_ACL if auth is None else CREATOR_ACL, no_chroot=self._no_chroot
        )
        self._recipe = Recipe(self._nodes)
        self._holds = Holds(self._nodes)
        self._connect_timeout = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self._edge = edge(lambda: self._session.address)

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
        reject_unknown(query, OPTIONS, "zk://")
        reject_unknown(options, OPTIONS, "zk://", keywords=True)
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

    # -- the request protocol ----------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Every primitive is served."""

    def lock_key(self, ref: LockRef) -> str:
        return self._layout.key(ref)

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
        self._holds.hooks = hooks
        session = self._session
        with self._edge:
            await session.start(self._connect_timeout)
            if self._ttl >= max_ttl(session.timeout):
                raise ConfigurationError(
                    f"ZooKeeper at {session.address} gave a session timeout of {session.timeout:g} s for the"
                    f" {session.requested_timeout:g} s asked (its minSessionTimeout/maxSessionTimeout): "
                    + ttl_refused(self._ttl, session.timeout)
                )
            if not self._chroot_checked:
                chroot = self._layout.chroot
                try:
                    await session.call(exists_request(chroot), chroot)
                except ZkError as exc:
                    if exc.code == NO_NODE:
                        raise self._no_chroot() from exc
                    raise
                self._chroot_checked = True

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        """Create the hold's node (once per hold) and read the contenders, in one round trip when free."""
        self.check_ttl(ttl)  # the negotiated session may be shorter than asked
        node = self._holds.get(hold)
        if node is None:
            node = node_for(ref, hold, self._layout.key(ref), self._session)
            self._holds.add(node)
        with self._edge:
            holds = await self._advance(node, wait=False, until=None)
            if holds:
                return Acquired(node.czxid, confirmed_at=self._session.confirmed_at)
            if enqueue:
                return Queued(None)
            await self._leave(node)
            return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """Watch the node ahead until the hold's node holds (Acquired) or ``until`` passes (Queued)."""
        node = self._holds.get(hold)
        if node is None:  # left the queue after a failure: join it again
            node = node_for(ref, hold, self._layout.key(ref), self._session)
            self._holds.add(node)
        with self._edge:
            if await self._advance(node, wait=True, until=until):
                return Acquired(node.czxid, confirmed_at=self._session.confirmed_at)
            return Queued(None)

    async def _advance(self, node: Node, *, wait: bool, until: float | None) -> bool:
        """The recipe's step; a refusal or a failed request other than a lost connection leaves the queue."""
        try:
            return await self._recipe.advance(node, wait=wait, until=until)
        except (ZkError, ValueError):
            await self._leave(node)
            raise

    async def _leave(self, node: Node) -> None:
        """Take ``node`` (and a semaphore's mutex) out of the queue, in the caller's task where it can."""
        self._holds.forget(node)
        mutex, node.mutex = node.mutex, None
        await self._nodes.let_go(node)
        if mutex is not None:
            await self._nodes.let_go(mutex)

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        node = self._holds.get(hold)
        if node is None or not node.held or not self._nodes.alive(node):
            return False
        node.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Delete the hold's node, held or queued; on trouble it is deleted in the background and this raises.

        A node whose create is unsettled (a cancelled acquire) is found by its
        GUID in the background. Waits at most a request window for a
        connection (and a request is given up after as long without an
        answer), so it never blocks for long; the background deletion goes on
        until it succeeds or the session ends, so no node outlives its release
        while the session lives.
        """
        node = self._holds.get(hold)
        if node is None:
            return False
        with self._edge:
            return await self._holds.release(node, self._window())

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One pipelined ``exists`` per held node, sent now: True if it is still ours."""
        with self._edge:
            return await self._holds.renew(items)

    async def info(self, ref: LockRef) -> LockInfo:
        session = self._session
        with self._edge:
            await session.wait_connected(self._window())
            return await describe(session, self._holds, ref, self._layout.key(ref))

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Delete the holder's node, whoever made it (``_breaking.py``); an asynclock holder loses its lease at once."""
        session = self._session
        with self._edge:
            await session.wait_connected(self._window())
            return await break_holder(session, self._holds, ref, self._layout.key(ref), owner)

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: the first contender's data (identity) and czxid (token); since is None."""
        session = self._session
        with self._edge:
            await session.wait_connected(self._window())
            leader, _ = await read_leader(session, self._layout.key(ref))
            return leader

    def observe(self, ref: LockRef) -> LeaderWatch:
        """The leader after each change, read again after every watch event (see :mod:`._election`)."""
        return ZkLeaderWatch(self._session, self._layout.key(ref), self._window(), self._edge)

    @property
    def where(self) -> str:
        """The server of the session's connection (else every server), as messages name it."""
        return f"ZooKeeper at {self._session.address}"

    async def names(self) -> list[str]:
        """Lock names under this client's prefix that are held or waited for now."""
        with self._edge:
            await self._session.wait_connected(self._window())
            return await lock_names(self._session, self._layout.base)

    async def aclose(self) -> None:
        """Close the session (the server deletes our nodes at once), bounded in time."""
        if self._nodes.closed:
            return
        self._nodes.closed = True
        await self._session.close(min(1.0, self._session.timeout / 2))
        await self._nodes.stop()

    # -- helpers -------------------------------------------------------------------------

    def _window(self) -> float:
        """How long a single request waits for a connection before failing."""
        return request_window(self.lease_time(self._ttl))

    def _no_chroot(self) -> ConfigurationError:
        return ConfigurationError(
            f"ZooKeeper at {self._session.address}: the chroot {self._layout.chroot} does not exist; create it"
            " (asynclock creates only what is under it) or leave it out of the URL"
        )
