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
from collections.abc import Sequence
from typing import Any

try:
    import grpc  # noqa: F401 - the client of this backend: fail here, with the hint, if it is missing
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the etcd backend needs grpcio: pip install 'asynclock[etcd]'") from exc

from ..._errors import BackendUnavailable, LockError
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT
from ..._values import Leader, LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LeaderWatch, LockRef, Queued, RenewItem
from ._breaking import break_holder
from ._channel import TlsOptions
from ._client import EtcdClient
from ._describe import describe, lock_names
from ._election import EtcdLeaderWatch, read_leader
from ._holds import Holds
from ._node import Node
from ._primitives import node_for
from ._queue import Queue
from ._recipe import Layout
from ._session import Session
from ._url import parse_url, target

__all__ = ["EtcdBackend", "parse_url"]


class EtcdBackend:
    """Locks on an etcd cluster (v3 API); the lease is one etcd lease per client.

    ``user``/``password`` log in (etcd's auth), ``ca_file``, ``cert_file``,
    ``key_file`` and ``server_name`` configure ``etcds://``;
    ``connect_timeout`` bounds connecting.
    """

    scheme = "etcd"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["etcd"].words

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
        self._session = Session(
            self._client,
            ttl=ttl,
            on_gone=lambda lease, reason, expired: self._holds.lease_gone(lease, reason, expired),
            holding=lambda: self._holds.holding(),
        )
        self._queue = Queue(self._client, self._session)
        self._holds = Holds(self._client, self._session, self._queue)
        self._serial = 0

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
    def where(self) -> str:
        """The members, as messages name them."""
        return f"etcd at {self._client.addresses}"

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
        self._holds.hooks = hooks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        await self._client.connect(self._connect_timeout)
        await self._session.start(deadline)

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        """Create the hold's key (once per hold) and read the contenders, in one round trip when free."""
        self.check_ttl(ttl)
        node = self._holds.get(hold)
        if node is None:
            node = self._join(ref, hold, ttl)
        if node.turn is not None:  # another task of this client has the client's key of this lock
            if enqueue:
                return Queued(None)
            self._holds.forget(node)
            self._queue.turns.leave(node)
            return Busy(None)
        if await self._advance(node, wait=False, until=None):
            return self._holds.acquired(node)
        if enqueue:
            return Queued(None)
        await self._leave(node)
        return Busy(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        """Wait for this client's turn at the lock, then watch the key ahead until the hold's key holds."""
        node = self._holds.get(hold)
        if node is None:  # left the queue after a failure: join it again
            node = self._join(ref, hold, ttl)
        if node.turn is not None and not await self._queue.turns.wait(node, until):
            return Queued(None)
        if await self._advance(node, wait=True, until=until):
            return self._holds.acquired(node)
        return Queued(None)

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        node = self._holds.get(hold)
        if node is None or not node.held or not node.alive:
            return False
        node.count = count
        return True

    async def release(self, ref: LockRef, hold: str) -> bool:
        """Delete the hold's key, held or queued; on trouble it is deleted in the background and this raises.

        A key whose create is not answered yet (an acquire cut short) is
        deleted in the background once it is. True only if a held key was deleted.
        """
        node = self._holds.pop(hold)
        if node is None:
            return False
        queue = self._queue
        if node.turn is not None:  # it never had a key: out of the client's turns
            queue.turns.leave(node)
            return False
        mutex, node.mutex = node.mutex, None
        if mutex is not None:  # a semaphore's waiter: the next one's turn at the mutex
            await queue.let_go(mutex)
        held, node.held = node.held, False
        self._holds.let_go_of(node)
        if not node.has_key or queue.closed:
            # no key, or its lease is gone (and every key of it)
            queue.turns.pass_on(node)
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
        queue.turns.pass_on(node)
        return held and deleted > 0

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One keep-alive of the client's lease and one transaction reading the held keys."""
        return await self._holds.renew(items, self.lease_time(self._ttl))

    async def info(self, ref: LockRef) -> LockInfo:
        key = self.lock_key(ref)
        local = self._queue.turns.waiting(key)  # (tasks of this client waiting for its key of a Mutex)
        return await describe(self._client, self._session, self._holds.nodes(), ref, key, local=local)

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Delete the holder's key, whoever put it, if it still holds (``_breaking.py``)."""
        return await break_holder(self._client, self._holds, lambda: self.info(ref), owner, self._session.window())

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
        """A new node for ``hold`` (a Mutex's or an Election's waits for its turn at the client's
        one key, behind another task of the client that has it)."""
        self._serial += 1
        node = node_for(ref, hold, ttl, self.lock_key(ref), self._serial, self._client, self._session)
        if node.turns is not None and not self._queue.turns.take(node):
            self._queue.turns.join(node)
        self._holds.add(node)
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
        self._holds.forget(node)
        mutex, node.mutex = node.mutex, None
        await self._queue.let_go(node)
        if mutex is not None:
            await self._queue.let_go(mutex)
