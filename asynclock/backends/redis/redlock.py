"""Redlock: one lock over N independent Redis primaries (``redlock://h1:p1,h2:p2,…``).

Each node keeps the hash lock of ``_hash.py`` (one :class:`HashLock` per
node). A hold exists while a majority, ``N // 2 + 1``, of the nodes have it:

* **Acquire** sends the acquire script to every node in parallel, each call
  bounded by a short per-node timeout. It succeeds when a majority answered
  "yours" before ``ttl - drift`` (drift = 1 % of the ttl + 2 ms) had passed
  since the request was sent. The front counts the lease's trusted deadline
  from that same send time (``lease_time(ttl) == ttl`` minus the front's
  drift), which is exactly the validity the algorithm grants. On failure the
  hold is released on every node (also those that did not answer) and the
  front is told ``Busy`` with a random part in ``retry_after``.
* **Waiting** listens on every node's release channel (one pub/sub connection
  per node, ``_pubsub.py``). The N messages of one release wake one local waiter, after a
  short random delay so that contenders who all rolled back do not retry in
  lock step; the wait is bounded by ``retry_after`` anyway.
* **Renewal** runs the renew script on every node; a lease is renewed only if
  a majority renewed it. A majority answering "not the holder" loses it at
  once; anything less decisive is an error the watchdog retries until the
  trusted deadline, and then the lease is lost.
* **Release** runs everywhere.

Fencing tokens: ``lease.token`` is always None. Each node can number its own
acquisitions, but a majority is a different set of nodes each time. A later
holder may win on nodes whose counters never saw the earlier holder (a
restarted node, or one the earlier holder reached only after its quorum was
counted), so no value derived from the nodes' answers is guaranteed to exceed
every earlier holder's: taking the maximum over one majority can go backwards
when the next majority overlaps the previous one only in a node that lost its
data. A token that can go backwards is worse than none.

What Redlock does not protect against: a holder process that pauses (GC,
swap, SIGSTOP) past its trusted deadline still believes it holds the lock
until it runs again; clocks that jump (the nodes expire keys by their own
clock); and a node that restarts empty too soon. Restart a crashed node only
after the longest lock ttl in use has passed (or run it with ``appendfsync
always``): otherwise the holder's majority can shrink below a majority and a
second client can get the lock while the first still holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redlock backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._errors import BackendUnavailable, ConfigurationError, LockError, plain
from ..._guarantees import TABLE
from ..._options import DEFAULT_CONNECT_TIMEOUT, mask_url, seconds, take_query
from ..._timing import drift
from ..._values import LockInfo
from ...abc import Acquired, BackendHooks, Busy, Kind, LockRef, RenewItem, unsupported
from .._breaking import break_by_release
from ._connection import GIVEN_CLIENT_HINT, Connection, address, password_hint
from ._hash import HashLock
from ._pubsub import PubSub
from ._urls import REDIS_PY_OPTIONS, check_options, connection_options, database

__all__ = ["RedlockBackend"]

logger = logging.getLogger("asynclock")

T = TypeVar("T")

#: Messages about the same release from different nodes within this many seconds wake one waiter.
SAME_RELEASE_WINDOW = 0.1


def quorum(nodes: int) -> int:
    """The majority of ``nodes``: ``nodes // 2 + 1``."""
    return nodes // 2 + 1


def _jitter(ttl: float) -> float:
    """A random pause that keeps contenders who all failed from retrying in lock step."""
    return random.uniform(0.0, min(0.05, ttl / 20))


class RedlockBackend:
    """One lock over N independent Redis primaries, held by a majority of them.

    Example::

        async with asynclock.connect("redlock://a:6379,b:6379,c:6379") as locks:
            async with locks.lock("orders:42") as lease:
                ...  # lease.token is None with Redlock

    ``node_timeout`` bounds each request to one node (default: an eighth of the
    lock's ttl, between 0.02 and 0.25 s); a node slower than that counts as
    absent for that request.
    """

    scheme = "redlock"
    #: What it guarantees (``locks.guarantees``): its row of :data:`asynclock._guarantees.TABLE`.
    guarantees = TABLE["redlock"].words

    def __init__(
        self,
        clients: Sequence[aioredis.Redis],
        *,
        prefix: str = "asynclock",
        owns_clients: bool = False,
        node_timeout: float | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        hint: str = GIVEN_CLIENT_HINT,
    ) -> None:
        if len(clients) < 1:
            raise ValueError("Redlock needs at least one Redis node")
        if node_timeout is not None and not node_timeout > 0:
            raise ValueError(f"node_timeout must be > 0, got {node_timeout!r}")
        self._nodes = [
            HashLock(_node_connection(client, connect_timeout, owns_clients, hint), prefix) for client in clients
        ]
        self._node_timeout = node_timeout
        self._quorum = quorum(len(clients))
        self._releases: _Releases | None = None  # made by ``start``
        self._ttl_hint = 5.0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> RedlockBackend:
        """``redlock://[user:password@]h1:p1,h2:p2,…[/db][?node_timeout=0.2&…]``.

        Other query parameters and ``options`` go to every node's client
        (``redis.asyncio.Redis.from_url``); one it does not take raises
        ValueError (naming the closest valid one) before any I/O.
        """
        rest, own = take_query(url, ("node_timeout",))
        parts = urlsplit(rest)
        check_options(
            rest,
            options,
            ("node_timeout",),
            "redlock://",
            passed_on=connection_options(aioredis.Connection),
            others=REDIS_PY_OPTIONS.replace("takes", "takes (for every node)"),
        )
        node_timeout: float | None = None
        raw_timeout = options.pop("node_timeout", own.get("node_timeout"))
        if raw_timeout is not None:
            node_timeout = seconds(raw_timeout, "node_timeout")
        database(parts.path, url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        addresses = [host.strip() for host in hosts.split(",") if host.strip()]
        if not addresses:
            raise ValueError(f"a Redlock URL names its nodes: redlock://h1:p1,h2:p2,h3:p3, not {mask_url(url)}")
        # Fail fast on a dead node: the per-node timeout is the only wait we want.
        options.setdefault("retry", Retry(NoBackoff(), 0))
        options.setdefault("socket_connect_timeout", connect_timeout)
        auth = f"{userinfo}@" if userinfo else ""
        tail = f"{parts.path}?{parts.query}" if parts.query else parts.path
        clients = [aioredis.Redis.from_url(f"redis://{auth}{address}{tail}", **options) for address in addresses]
        return cls(
            clients,
            prefix=prefix,
            owns_clients=True,
            node_timeout=node_timeout,
            connect_timeout=connect_timeout,
            hint=password_hint("redlock", hosts, parts.path),
        )

    @property
    def where(self) -> str:
        """The nodes, as messages name them."""
        return "Redlock at " + ",".join(node.connection.where.removeprefix("Redis at ") for node in self._nodes)

    @property
    def nodes(self) -> list[HashLock]:
        """The hash lock of each node (for tests and tools)."""
        return list(self._nodes)

    @property
    def quorum(self) -> int:
        return self._quorum

    @property
    def listeners(self) -> list[PubSub]:
        """Each node's pub/sub connection (for tests): none before ``start`` and after ``aclose``."""
        return [] if self._releases is None else self._releases.listeners

    def node_timeout(self, ttl: float) -> float:
        """How long one request to one node may take for a lock of ``ttl`` seconds."""
        if self._node_timeout is not None:
            return self._node_timeout
        # An acquire that fails takes two of these (try, roll back), and the
        # front allows a request a third of the ttl.
        return min(max(ttl / 8, 0.02), 0.25)

    # -- fan-out ------------------------------------------------------------------

    async def _each(
        self, ttl: float, call: Callable[[HashLock], Coroutine[Any, Any, T]], nodes: Sequence[HashLock] | None = None
    ) -> list[T | BaseException]:
        """``call(node)`` on every node (or ``nodes``) in parallel, each bounded; exceptions are returned."""

        async def one(node: HashLock) -> T:
            bound = self.node_timeout(ttl)
            try:
                async with asyncio.timeout(bound):
                    return await call(node)
            except TimeoutError:
                raise BackendUnavailable(f"{node.connection.where} did not answer within {bound:.3g} s") from None

        chosen = self._nodes if nodes is None else nodes
        return list(await asyncio.gather(*(one(node) for node in chosen), return_exceptions=True))

    def _verdict(self, answers: Sequence[bool | BaseException], what: str) -> bool:
        """A majority said True: True; so many said False that no majority can: False; else raise."""
        yes = sum(1 for answer in answers if answer is True)
        no = sum(1 for answer in answers if answer is False)
        if yes >= self._quorum:
            return True
        if no > len(self._nodes) - self._quorum:
            return False
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        raise _no_quorum(what, yes, len(self._nodes), self._quorum, errors)

    # -- protocol -----------------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        """Only the plain lock."""
        if kind == "election":
            raise unsupported(
                self.scheme,
                kind,
                "an election needs one line of candidates and a token that grows from leader to leader, and "
                "independent nodes keep neither (each orders its own line, and Redlock has no safe fencing "
                "token); use a single Redis server (redis://), Sentinel (redis+sentinel://), Redis Cluster "
                "(redis+cluster://), ZooKeeper, etcd or PostgreSQL",
            )
        if kind != "lock":
            raise unsupported(self.scheme, kind, "use several redis:// locks or a redis:// primitive")

    def lock_key(self, ref: LockRef) -> str:
        return self._nodes[0].key(ref.name)

    def lease_time(self, ttl: float) -> float:
        # The front's deadline, send time + ttl - drift(ttl), is the Redlock validity.
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._releases = _Releases(self._nodes, self._quorum, hooks)

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy:
        """Ask every node; Acquired(None) if a majority said yes in time, else give back and Busy."""
        name = ref.name
        loop = asyncio.get_running_loop()
        sent = loop.time()
        self._ttl_hint = ttl
        for listener in self.listeners:
            listener.note_ttl(ttl)
        answers = await self._each(ttl, lambda node: node.try_acquire(name, hold, ttl))
        valid_until = sent + ttl - drift(ttl)
        got = sum(1 for answer in answers if isinstance(answer, Acquired))
        if got >= self._quorum and loop.time() < valid_until:
            return Acquired(None)
        # No valid majority: give back whatever we may hold, on the nodes that
        # said yes and on those that did not answer (the script may have run
        # there). Now, not later: the front may retry under the same hold id.
        unsure = [node for node, answer in zip(self._nodes, answers, strict=True) if not isinstance(answer, Busy)]
        if unsure:
            await self._each(ttl, lambda node: node.release(name, hold), unsure)
        busy = sorted(answer.retry_after or 0.0 for answer in answers if isinstance(answer, Busy))
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        if len(errors) > len(self._nodes) - self._quorum:
            raise _no_quorum("acquire", got, len(self._nodes), self._quorum, errors)
        missing = self._quorum - got
        # A majority frees up once ``missing`` more busy nodes expired; a
        # release wakes us sooner.
        expiry = busy[missing - 1] if 0 < missing <= len(busy) else 0.0
        return Busy(expiry + _jitter(ttl))

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        answers = await self._each(ttl, lambda node: node.set_count(ref.name, hold, count, ttl))
        return self._verdict(answers, "record the hold count")

    async def release(self, ref: LockRef, hold: str) -> bool:
        answers = await self._each(self._longest_ttl(), lambda node: node.release(ref.name, hold))
        return self._verdict(answers, "release")

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        if not items:
            return []
        ttl = min(item.ttl for item in items)
        per_node = await self._each(ttl, lambda node: node.renew(items))
        results: list[bool | BaseException] = []
        for index in range(len(items)):
            answers = [node if isinstance(node, BaseException) else node[index] for node in per_node]
            try:
                results.append(self._verdict(answers, "renew"))
            except LockError as exc:
                results.append(exc)
        return results

    async def subscribe(self, name: str) -> None:
        """Listen on every node's release channel of ``name``; ConfigurationError if no majority can."""
        releases = self._releases
        if releases is None:  # closed (or not started): no notifications to wait for
            raise BackendUnavailable("the Redlock backend is closed")
        await releases.subscribe(name, self.node_timeout(self._longest_ttl()))

    async def unsubscribe(self, name: str) -> None:
        if self._releases is not None:  # (closed: nothing listens any more)
            await self._releases.unsubscribe(name, self.node_timeout(self._longest_ttl()))

    async def info(self, ref: LockRef) -> LockInfo:
        name = ref.name
        answers = await self._each(self._longest_ttl(), lambda node: node.info(name))
        found = [answer for answer in answers if isinstance(answer, LockInfo)]
        if len(found) < self._quorum:
            errors = [answer for answer in answers if isinstance(answer, BaseException)]
            raise _no_quorum("read the lock", len(found), len(self._nodes), self._quorum, errors)
        by_owner: dict[str, list[LockInfo]] = {}
        for node_info in found:
            if node_info.owner is not None:
                by_owner.setdefault(node_info.owner, []).append(node_info)
        holder = max(by_owner.values(), key=len, default=[])
        if len(holder) < self._quorum:
            return LockInfo(
                name=name, key=self.lock_key(ref), owner=None, hold_count=0, ttl=None, waiters=None, token=None
            )
        # The hold lasts while a majority still has it.
        ttls = sorted((node_info.ttl or 0.0 for node_info in holder), reverse=True)
        return LockInfo(
            name=name,
            key=self.lock_key(ref),
            owner=holder[0].owner,
            hold_count=max(node_info.hold_count for node_info in holder),
            ttl=ttls[self._quorum - 1],
            waiters=None,
            token=None,
        )

    async def break_lock(self, ref: LockRef, owner: str | None) -> LockInfo | None:
        """Release the holder's hold on every node by its identity, as its own release would."""
        return await break_by_release(self, ref, owner)

    async def names(self) -> list[str]:
        """Names of the locks some reachable node has under this client's prefix."""
        answers = await self._each(self._longest_ttl(), lambda node: node.names())
        found: set[str] = set()
        for answer in answers:
            if isinstance(answer, list):
                found.update(answer)
        return sorted(found)

    async def aclose(self) -> None:
        releases, self._releases = self._releases, None
        if releases is not None:
            await releases.aclose()
        await asyncio.gather(*(node.connection.aclose() for node in self._nodes), return_exceptions=True)

    def _longest_ttl(self) -> float:
        """For requests that carry no ttl: the ttl of the latest acquire (5 s before any)."""
        return self._ttl_hint


def _node_connection(client: aioredis.Redis, connect_timeout: float, owns_client: bool, hint: str) -> Connection:
    """The connection to one node, named by its address in errors; ``hint`` says how to give it a password."""
    settings = dict(client.connection_pool.connection_kwargs)
    return Connection(
        client,
        where=f"Redis at {address(settings)}",
        connect_timeout=connect_timeout,
        secrets=[settings.get("password")],
        owns_client=owns_client,
        hint=hint,
    )


def _no_quorum(what: str, yes: int, nodes: int, needed: int, errors: Sequence[BaseException]) -> LockError:
    """Why no majority answered: a ConfigurationError if refusals alone leave no majority.

    When every failing node could not be connected to at all, the error
    carries the connect timeout (a caller gives up after it, not after a ttl).
    """
    detail = "; ".join(sorted({plain(error) for error in errors})[:3]) or "no node answered"
    refused = [error for error in errors if isinstance(error, ConfigurationError)]
    error: LockError
    if len(refused) > nodes - needed:
        every = "; ".join(str(error) for error in refused)  # each names its node
        error = ConfigurationError(f"Redlock could not {what}: {len(refused)} of {nodes} nodes refused: {every}")
        error.__cause__ = refused[0]
        return error
    error = BackendUnavailable(f"Redlock could not {what} on a majority ({yes} of {nodes}, {needed} needed): {detail}")
    unreachable = [
        error.connect_timeout
        for error in errors
        if isinstance(error, BackendUnavailable) and error.connect_timeout is not None
    ]
    if errors and len(unreachable) + len(refused) == len(errors) and unreachable:
        error.connect_timeout = max(unreachable)
    if errors:
        error.__cause__ = errors[0]
    return error


class _DelayedWake:
    """One wake per release, a little late, from the messages of every node.

    The same release arrives from every node that had it (the message is the
    releasing hold id); only the first wakes a waiter. The wake comes after a
    short random delay: when contenders all fail to reach a majority, each
    one's roll-back wakes the others, and without the delay they would all
    try again at the same instant.
    """

    def __init__(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        self._handles: set[asyncio.TimerHandle] = set()
        self._seen: dict[tuple[str, bytes], float] = {}

    def released(self, name: str, hold: bytes) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if len(self._seen) > 64:
            self._seen = {key: until for key, until in self._seen.items() if until > now}
        if self._seen.get((name, hold), 0.0) > now:
            return
        self._seen[(name, hold)] = now + SAME_RELEASE_WINDOW
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._handles.discard(handle)
            self._hooks.wake_one(name)

        handle = loop.call_later(_jitter(1.0), fire)
        self._handles.add(handle)

    def wake_all(self) -> None:
        """A node's channel was subscribed again (or refused): releases may have been missed."""
        self._hooks.wake_all()

    def cancel(self) -> None:
        """No wake that is still to come comes (the backend is closing)."""
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()


class _Releases:
    """Releases on every node, as this client hears them: one pub/sub connection per node
    (``listeners``), and one local wake per release (``wake``)."""

    def __init__(self, nodes: Sequence[HashLock], quorum: int, hooks: BackendHooks) -> None:
        self._nodes = nodes
        self._quorum = quorum
        self.listeners = [PubSub(node.connection) for node in nodes]
        self.wake = _DelayedWake(hooks)

    async def subscribe(self, name: str, timeout: float) -> None:
        """Listen on every node's release channel of ``name`` (each node's subscription bounded
        by ``timeout``); ConfigurationError if so many nodes refuse that no majority can tell
        this client of a release."""
        wake = self.wake

        def released(payload: bytes) -> None:
            wake.released(name, payload)

        async def one(node: HashLock, listener: PubSub) -> None:
            # A node that is down or stalled subscribes (and wakes everyone)
            # when it comes back; meanwhile the others' messages and the
            # holder's lease bound the wait.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await listener.route(node.channel(name), released, wake.wake_all, wait_connect=True)

        answers = await asyncio.gather(
            *(one(node, listener) for node, listener in zip(self._nodes, self.listeners, strict=True)),
            return_exceptions=True,
        )
        refused = [answer for answer in answers if isinstance(answer, ConfigurationError)]
        if len(refused) > len(self._nodes) - self._quorum:
            raise refused[0]  # no majority can tell this client of a release
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, LockError):
                raise answer
            if isinstance(answer, ConfigurationError):
                logger.warning("a Redlock node refused this client: %s", answer)

    async def unsubscribe(self, name: str, timeout: float) -> None:
        """Stop listening on every node's release channel of ``name`` (each bounded by ``timeout``)."""

        async def one(node: HashLock, listener: PubSub) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await listener.unroute(node.channel(name))

        await asyncio.gather(*(one(node, listener) for node, listener in zip(self._nodes, self.listeners, strict=True)))

    async def aclose(self) -> None:
        self.wake.cancel()
        await asyncio.gather(*(listener.aclose() for listener in self.listeners), return_exceptions=True)
