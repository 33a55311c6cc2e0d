"""etcd v3 (``etcd://host:2379,host:2379[/path]``, ``etcds://`` for TLS): the lock of etcd's Go client.

The plain lock is etcd's ``concurrency.Mutex`` recipe, key for key (see
:mod:`._recipe`), so Go services, ``etcdctl lock`` and asynclock exclude each
other on one lock. The lock ``name`` of a client with URL path ``/path``
and key prefix ``prefix`` (``connect(prefix=…)``, default ``asynclock``) is
the Mutex prefix ``/path/prefix/<name>`` (``prefix/<name>`` without a URL
path; ``/`` and ``%`` in the name percent-encoded): ``lock.key``. Go's
``concurrency.NewMutex(session, lock.key)`` and ``etcdctl lock <lock.key>``
contend with ``locks.lock(name)``.

Requests: ``try_acquire`` creates the hold's contender key in a transaction
that also reads the first contender (for the Mutex: one round trip when the
lock is free): held, or queued (the key stays), or, not queueing, the key
is deleted and the answer is Busy. ``wait_queued`` watches the one key
ahead in the caller's task until it is deleted, and reads again. ``release``
deletes the key, held or queued; a create that etcd may still apply after
its caller was cancelled is waited for before the key is deleted (see
:mod:`._queue`).

Lease: one etcd lease per client (:mod:`._session`), granted when it
connects with a TTL of the client's ``ttl`` rounded up to whole seconds
(etcd counts leases in seconds, and raises a TTL below its minimum, 1.5
election timeouts). Every contender key of the client is attached to it.
While the client holds locks, the watchdog's renewals are its keep-alives:
one ``LeaseKeepAlive`` for the whole client per renewal round, on one stream,
sent with one transaction that reads the held keys (a key deleted by
someone else is a lost hold). While it holds nothing (it may be waiting),
the backend keeps the lease alive itself every third of the lease time. The
trusted deadline of a hold counts from the send time of the last
keep-alive etcd answered, plus the client's ``ttl`` (never more than the TTL
etcd granted): etcd renews the lease when a keep-alive *arrives*, for the
whole granted TTL, so it cannot expire the lease, and delete the keys,
before then. A keep-alive answered "no such lease" (expired or revoked), or
no confirmation within the lease time, loses every hold under the lease at
once; waiters then queue again under a new lease.

Tasks of one client: the Mutex keys a contender by its lease, so a client
has one key per lock. Its tasks take turns for it in the client, first come
first served; each turn puts the key anew (a new create revision, so a new
fencing token). Go's Mutex lets every Mutex of one session (lease) hold at
once; asynclock never shares its lease, so that never happens with it.

Why a client of our own (:mod:`._client` on grpcio alone, the messages in
:mod:`._wire` and :mod:`._replies`) and not ``aetcd`` (asyncio, grpc.aio;
the maintained Python client): measured here against etcd 3.4 on loopback,
a put+delete pair costs the same through both (0.70 ms vs 0.68 ms: etcd's
own write path dominates), but a keep-alive costs 0.2 ms on one long-lived
stream vs 0.5 to 0.6 ms through aetcd, which opens a stream per keep-alive.
And the lock needs what aetcd does not have: several endpoints with
failover (aetcd connects to one host and port), TLS (its ``connect`` opens
plaintext channels only), a fresh token when the auth token expires, a
deadline on every request, a create that outlives its cancelled caller, and
one multiplexed watch stream whose loss every waiter hears of. Its upkeep:
releases in 2023 (1.0.0a4) and 2026 (1.0.0, packaging and Python versions
only). The dozen messages the lock uses are few enough to write by hand,
which also drops the protobuf runtime and generated code from the
dependencies.

More primitives: the fair lock is the lock itself (the Mutex is FIFO), so
both have one key and share one hold; the read-write lock follows etcd's Go
RWMutex recipe; the semaphore is Curator's InterProcessSemaphoreV2 on etcd
keys; an election is etcd's ``concurrency.Election`` (``etcdctl elect``),
the Mutex's rules with the candidate's identity as its key's value, under
``<base>/%election/<name>`` (:mod:`._election` tells who leads). Fencing
tokens are create revisions.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

try:
    import grpc  # noqa: F401 - the client of this backend: fail here, with the hint, if it is missing
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the etcd backend needs grpcio: pip install 'asynclock[etcd]'") from exc

from ..._errors import BackendUnavailable, LockError
from ..._options import DEFAULT_CONNECT_TIMEOUT
from ..._values import Leader, LockInfo, LossReason
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from . import _recipe
from ._channel import TlsOptions
from ._client import EtcdClient
from ._describe import check_permits, describe, lock_names
from ._election import EtcdLeaderWatch, read_leader
from ._queue import Node, Queue
from ._recipe import Layout
from ._replies import TxnResult
from ._session import Lease, Session
from ._url import parse_url, target
from ._wire import Op

__all__ = ["EtcdBackend", "parse_url"]

#: Most operations of one etcd transaction (etcd's ``--max-txn-ops`` default).
_MAX_TXN_OPS = 128


class EtcdBackend:
    """Locks on an etcd cluster (v3 API); the lease is one etcd lease per client.

    ``user``/``password`` log in (etcd's auth), ``ca_file``, ``cert_file``,
    ``key_file`` and ``server_name`` configure ``etcds://``;
    ``connect_timeout`` bounds connecting.
    """

    scheme = "etcd"

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        path: str = "",
        prefix: str = "asynclock",
        ttl: float = 30.0,
        tls: TlsOptions | None = None,
        user: str | None = None,
        password: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if password is not None and user is None:
            raise ValueError("an etcd password needs a user")
        self._client = EtcdClient(endpoints, tls=tls, user=user, password=password)
        self._layout = Layout(f"{path}/{prefix}" if path else prefix)
        self._ttl = ttl
        self._connect_timeout = connect_timeout
        self._session = Session(self._client, ttl=ttl, on_gone=self._lease_gone, holding=self._holding)
        self._queue = Queue(self._client, self._session)
        #: every acquisition this client has a key (or a turn) for, by hold id
        self._nodes: dict[str, Node] = {}
        #: the nodes that hold now (the watchdog keeps the lease alive while there are any)
        self._held: set[Node] = set()
        self._serial = 0
        self._hooks: BackendHooks | None = None

    def __repr__(self) -> str:
        return f"<EtcdBackend {self._client.addresses} base={self._layout.base!r}>"

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        ttl: float = 30.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> EtcdBackend:
        """A backend for ``etcd[s]://[user:password@]h1:p1,h2:p2[/path]?option=value``.

        Unknown options raise ValueError naming the valid ones, a TLS option on
        ``etcd://`` raises ValueError; no I/O.
        """
        found = target(url, options)
        return cls(
            found.endpoints,
            path=found.path,
            prefix=prefix,
            ttl=ttl,
            tls=found.tls,
            user=found.user,
            password=found.password,
            connect_timeout=connect_timeout,
        )

    # -- for tests and tools ------------------------------------------------------------

    @property
    def client(self) -> EtcdClient:
        """The etcd client."""
        return self._client

    @property
    def layout(self) -> Layout:
        """Where this client's locks live."""
        return self._layout

    @property
    def lease_id(self) -> int:
        """The client's etcd lease (0 while it has none)."""
        lease = self._session.current
        return 0 if lease is None else lease.id

    @property
    def confirmed_at(self) -> float:
        """The send time (loop time) of the last request etcd answered with the client's lease alive."""
        return self._session.confirmed_at

    @property
    def granted(self) -> float:
        """The TTL etcd granted the client's lease, in seconds."""
        return self._session.granted

    # -- the request protocol -------------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Every primitive is served."""

    def lock_key(self, ref: LockRef) -> str:
        """The Mutex prefix of a plain or fair lock (one lock: the Mutex is FIFO), the
        Election prefix of an election, else the directory of the read-write lock's or
        the semaphore's keys."""
        if ref.kind in ("lock", "fair"):
            return self._layout.lock_key(ref.name)
        if ref.kind == "election":
            return self._layout.election_key(ref.name)
        if ref.kind in ("read", "write"):
            return self._layout.rw_key(ref.name)
        return self._layout.semaphore_key(ref.name)

    def lease_time(self, ttl: float) -> float:
        """The lock's ttl, but never more than the TTL etcd granted the client's lease."""
        return self._session.lease_time(ttl)

    def check_ttl(self, ttl: float) -> None:
        """ValueError for a lock ttl the client's lease cannot carry (renewed every ttl/3)."""
        if ttl / 3 >= 0.75 * self.lease_time(ttl):
            raise ValueError(
                f"an etcd lock's ttl ({ttl}s) must stay well under 2.25 times the client's ttl "
                f"({self._ttl}s): the client's etcd lease is every lock's lease"
            )

    async def start(self, hooks: BackendHooks) -> None:
        """Reach a member (and log in), and get the client's lease, within the connect timeout."""
        self._hooks = hooks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        await self._client.connect(self._connect_timeout)
        await self._session.start(deadline)

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        """Create the hold's key (once per hold) and read the contenders, in one round trip when free."""
        self.check_ttl(ttl)
        node = self._nodes.get(hold)
        if node is None:
            node = self._join(ref, hold, ttl)
        if node.turn is not None:  # another task of this client has the client's key of this lock
            if enqueue:
                return Queued(None)
            self._forget(node)
            self._queue.leave_turns(node)
            return Busy(None)
        if await self._advance(node, wait=False, until=None):
            return self._acquired(node)
        if enqueue:
            return Queued(None)
        await self._leave(node)
        return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """Wait for this client's turn at the lock, then watch the key ahead until the hold's key holds."""
        node = self._nodes.get(hold)
        if node is None:  # left the queue after a failure: join it again
            node = self._join(ref, hold, ttl)
        if node.turn is not None and not await self._queue.wait_turn(node, until):
            return Queued(None)
        if await self._advance(node, wait=True, until=until):
            return self._acquired(node)
        return Queued(None)

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        node = self._nodes.get(hold)
        if node is None or not node.held or not node.alive:
            return False
        node.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Delete the hold's key, held or queued; on trouble it is deleted in the background and this raises.

        A key whose create is not answered yet (an acquire cut short) is
        deleted in the background once it is. True only if a held key was deleted.
        """
        node = self._nodes.pop(hold, None)
        if node is None:
            return False
        queue = self._queue
        if node.turn is not None:  # it never had a key: out of the client's turns
            queue.leave_turns(node)
            return False
        mutex, node.mutex = node.mutex, None
        if mutex is not None:  # a semaphore's waiter: the next one's turn at the mutex
            await queue.let_go(mutex)
        held, node.held = node.held, False
        self._let_go_of(node)
        if not node.has_key or queue.closed:
            # no key, or its lease is gone (and every key of it)
            queue.pass_turn(node)
            return False
        if node.creating is not None or node.uncertain:
            queue.finish_later(node)
            return False
        assert node.contender is not None
        try:
            deleted = await self._client.remove(node.contender.remove, self._session.window())
        except BaseException:
            queue.finish_later(node)  # (a retry of this release finds nothing: the front counts it done)
            raise
        queue.pass_turn(node)
        return held and deleted > 0

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One keep-alive of the client's lease and one transaction reading the held keys."""
        lease = self._session.usable()
        nodes = [self._nodes.get(item.hold) for item in items]
        if lease is None:
            return [False] * len(items)
        live = [node for node in nodes if node is not None and node.held and node.lease is lease]
        keys = [node.contender.key for node in live if node.contender is not None]
        timeout = self.lease_time(self._ttl)
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

    async def info(self, ref: LockRef) -> LockInfo:
        key = self.lock_key(ref)
        nodes = self._nodes.values()
        if ref.kind in ("lock", "fair", "election"):
            local = self._queue.waiting_turns(key)
            return await describe(
                self._client, self._session, nodes, ref.name, key, f"{key}/".encode(), lambda kvs: kvs[:1], local=local
            )
        if ref.kind in ("read", "write"):
            pick = functools.partial(_recipe.rw_holders, rw_key=key)
            return await describe(self._client, self._session, nodes, ref.name, key, f"{key}/".encode(), pick)
        permits = ref.permits
        leases, waiting = f"{key}/leases/".encode(), f"{key}/locks/".encode()
        return await describe(
            self._client, self._session, nodes, ref.name, key, leases, lambda kvs: kvs[:permits], queue=waiting
        )

    async def leader(self, ref: LockRef) -> Leader | None:
        """The election's leader: the first candidate's value (identity) and create revision (token)."""
        return await read_leader(self._client, self.lock_key(ref), self._session.window())

    def observe(self, ref: LockRef) -> LeaderWatch:
        """Every change of the election's leader, from a watch of its candidates (see :mod:`._election`)."""
        return EtcdLeaderWatch(self._client, self._session, self.lock_key(ref))

    async def names(self) -> list[str]:
        """Plain lock names under this client's prefix that have contenders now."""
        return await lock_names(self._client, self._layout, self._session.window())

    async def aclose(self) -> None:
        """Revoke the lease (etcd deletes every key of it at once) and close, bounded in time."""
        if self._queue.closed:
            return
        self._queue.closed = True
        await self._session.aclose()
        await self._queue.aclose()
        await self._client.close()

    # -- helpers ----------------------------------------------------------------------------

    def _join(self, ref: LockRef, hold: str, ttl: float) -> Node:
        """A new node for ``hold``: a contender of ``ref``'s recipe (or a turn at the client's
        one key of a Mutex, behind another task of the client that has it)."""
        key = self.lock_key(ref)
        self._serial += 1
        serial = self._serial
        if ref.kind in ("lock", "fair", "election"):
            # (the Mutex and the Election key a contender by its lease: the client's tasks take turns)
            if ref.kind == "election":
                identity = ref.identity or ""
                node = Node(ref.name, hold, ttl, lambda lease: _recipe.candidate(key, lease, identity), turns=key)
            else:
                node = Node(ref.name, hold, ttl, lambda lease: _recipe.mutex(key, lease), turns=key)
            if not self._queue.take_turn(node):
                self._queue.join_turns(node)
        elif ref.kind == "write":
            node = Node(ref.name, hold, ttl, lambda lease: _recipe.writer(key, lease, serial))
        elif ref.kind == "read":
            node = Node(ref.name, hold, ttl, lambda lease: _recipe.reader(key, lease, serial))
        else:
            permits = ref.permits
            node = Node(ref.name, hold, ttl, lambda lease: _recipe.semaphore_lease(key, lease, serial, permits))
            node.mutex = Node(ref.name, hold, ttl, lambda lease: _recipe.semaphore_mutex(key, lease, serial))
            leases = f"{key}/leases/".encode()
            node.verify = lambda: check_permits(self._client, ref.name, leases, permits, self._session.window())
        self._nodes[hold] = node
        return node

    async def _advance(self, node: Node, *, wait: bool, until: float | None) -> bool:
        """The queue's step; a failure other than etcd out of reach leaves the queue."""
        try:
            return await self._queue.advance(node, wait=wait, until=until)
        except BackendUnavailable:
            raise  # the front retries with this hold, or releases it
        except (LockError, ValueError):
            await self._leave(node)
            raise

    async def _leave(self, node: Node) -> None:
        """Take ``node`` (and a semaphore's mutex) out of the queue, in the caller's task where it can."""
        self._forget(node)
        mutex, node.mutex = node.mutex, None
        await self._queue.let_go(node)
        if mutex is not None:
            await self._queue.let_go(mutex)

    def _forget(self, node: Node) -> None:
        if self._nodes.get(node.hold) is node:
            del self._nodes[node.hold]
        self._let_go_of(node)

    def _let_go_of(self, node: Node) -> None:
        """``node`` holds no more; after the last hold the lease needs the backend's keep-alives again."""
        if node in self._held:
            self._held.discard(node)
            if not self._held:
                self._session.holds_ended()

    def _acquired(self, node: Node) -> Acquired:
        """Held: the token is the key's create revision, the proof the confirmation of its lease."""
        assert node.lease is not None
        self._held.add(node)
        return Acquired(node.revision, confirmed_at=node.lease.confirmed_at)

    def _holding(self) -> bool:
        return bool(self._held)

    def _lease_gone(self, lease: Lease, reason: str, expired: bool) -> None:
        """The lease ``lease`` is gone: every hold under it is lost, waiters queue again."""
        self._queue.lease_gone()
        gone = [node for node in self._held if node.lease is lease]
        for node in gone:
            self._held.discard(node)
        lost = [node.hold for node in gone]
        if lost and self._hooks is not None:
            # what carried the holds ended (etcd says so), or was not confirmed by their deadline
            loss = LossReason.CONNECTION_LOST if expired else LossReason.RENEWAL_FAILED
            self._hooks.lose(lost, f"the etcd lease was lost: {reason}", loss)
