"""The client's etcd lease: granted, kept alive, and known to be gone.

As the ``Session`` of etcd's Go ``concurrency`` package: one lease per
client, whose keep-alive the session owns; the lock recipes only attach
their keys to it. A :class:`Lease` is one grant; when it is gone a new one
is granted, never the old one revived.

* Confirmation: ``confirmed_at`` is the send time of the last request that
  etcd answered with the lease alive (the grant, or a keep-alive). etcd
  renews a lease when a keep-alive *arrives*, for the whole TTL it granted,
  so the lease, and every key attached to it, lives at least until
  ``confirmed_at`` plus that TTL.
* Keeping it alive: while the client holds locks the watchdog's renewals
  are the keep-alives (:meth:`Session.keepalive`, one for every hold of a
  renewal round); while it holds none (it may be waiting) the session sends
  one itself every third of the lease time.
* Gone: a keep-alive answered "no such lease" (expired or revoked), or a
  confirmation older than the lease time (:meth:`Session.lease_time` of the
  client's ttl): then every hold under it is past its trusted deadline, and
  etcd may expire it any moment. Its holds are lost at once (the
  ``on_gone`` callback), a lease that may still live is revoked in the
  background (its keys go with it), and new acquires get a new lease. A
  grant therefore always carries the confirmation of the lease it was made
  under, and that confirmation is young enough to be trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ..._errors import ConfigurationError, LockError
from ..._timing import Backoff, request_window
from .._background import Background
from ._client import EtcdClient
from ._errors import EtcdError, EtcdUnavailable, said

__all__ = ["Lease", "Session"]

logger = logging.getLogger("asynclock")


@dataclass(eq=False)
class Lease:
    """One etcd lease of the client."""

    id: int
    #: loop time at which the last request that etcd answered with this lease alive was sent
    confirmed_at: float
    gone: bool = False


class Session:
    """The client's lease: one at a time, granted on demand, kept alive while nobody else does.

    ``on_gone(lease, reason, expired)`` is called once when a lease is known to
    be gone (``expired``: etcd said so; otherwise it was not confirmed in
    time). ``holding()`` says whether the watchdog renews holds now (its
    renewals keep the lease alive then).
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        ttl: float,
        on_gone: Callable[[Lease, str, bool], None],
        holding: Callable[[], bool],
    ) -> None:
        self._client = client
        self._ttl = ttl
        #: the TTL etcd is asked for (whole seconds, at least 1)
        self._ask = max(1, math.ceil(ttl))
        #: the TTL etcd granted (it may raise it to its minimum)
        self.granted = float(self._ask)
        self.current: Lease | None = None
        #: the last confirmation of any lease of this client (for tests and tools)
        self.confirmed_at = 0.0
        self._on_gone = on_gone
        self._holding = holding
        self._grant_lock: asyncio.Lock | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        #: the keeper sleeps while the watchdog keeps the lease alive: a release of the last hold wakes it
        self._behind_watchdog = False
        #: revocations of leases that may still live, sent in the background
        self._tasks = Background()
        self.closed = False

    def lease_time(self, ttl: float) -> float:
        """A lock's ttl, but never more than the TTL etcd granted the lease."""
        return min(ttl, self.granted)

    def window(self) -> float:
        """How long one request may take."""
        return request_window(self.lease_time(self._ttl))

    async def start(self, deadline: float) -> None:
        """Grant the first lease (by ``deadline``) and start keeping it alive."""
        await self.ensure(deadline)
        if self._keeper is None:
            self._wake = asyncio.Event()
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="asynclock-etcd-lease")

    def wake(self) -> None:
        """Something changed that the keeper waits on (a lease came or went)."""
        if self._wake is not None:
            self._wake.set()

    def holds_ended(self) -> None:
        """The client holds nothing any more: the keeper takes the keep-alives back."""
        if self._behind_watchdog:
            self.wake()

    # -- the lease ------------------------------------------------------------------------

    def usable(self) -> Lease | None:
        """The current lease, unless it is gone (a stale one is declared gone here)."""
        lease = self.current
        if lease is not None and self._stale(lease):
            self.gone(lease, "its keep-alives were not answered within the lease time", expired=False)
            return None
        return lease

    def fresh_for(self, lease: Lease, ttl: float) -> bool:
        """Whether a grant under ``lease`` now leaves a hold of ``ttl`` most of its lease time."""
        age = asyncio.get_running_loop().time() - lease.confirmed_at
        return not lease.gone and age < self.lease_time(ttl) / 2

    async def ensure(self, deadline: float) -> Lease:
        """The current lease, granted now if there is none (one grant for every caller)."""
        lease = self.usable()
        if lease is not None:
            return lease
        if self._grant_lock is None:
            self._grant_lock = asyncio.Lock()
        try:
            async with asyncio.timeout_at(deadline):
                async with self._grant_lock:
                    lease = self.usable()
                    if lease is None:
                        lease = await self._grant()
        except TimeoutError:
            raise EtcdUnavailable(f"no etcd lease from {self._client.addresses} in time") from None
        return lease

    async def _grant(self) -> Lease:
        loop = asyncio.get_running_loop()
        # a lease id of our choosing: a grant repeated after a lost answer is recognised
        lease_id = secrets.randbits(62) | 1
        backoff = Backoff()
        while True:
            if self.closed:
                raise EtcdUnavailable("the etcd client is closed")
            sent = loop.time()
            try:
                answer = await self._client.grant(self._ask, lease_id, self.window())
            except EtcdUnavailable:
                await asyncio.sleep(backoff.next())
                continue
            except EtcdError as exc:
                if "lease already exists" not in exc.details:
                    raise
                # our grant went through, its answer was lost: a keep-alive tells
                # whether it lives, counted from a send time we know
                sent = loop.time()
                answer = await self._client.keepalive(lease_id, self.window())
                if answer.ttl <= 0:
                    lease_id = secrets.randbits(62) | 1
                    continue
            if answer.error:
                raise EtcdError("LEASE_GRANT", answer.error, self._client.current)
            self.granted = float(max(answer.ttl, 1))
            lease = self.current = Lease(lease_id, sent)
            self.confirmed_at = sent
            logger.debug("etcd lease %x granted, TTL %ss", lease_id, answer.ttl)
            self.wake()
            return lease

    async def keepalive(self, lease: Lease, timeout: float) -> bool:
        """One keep-alive of ``lease``: whether it lives (a lease etcd no longer has is gone)."""
        sent = asyncio.get_running_loop().time()
        answer = await self._client.keepalive(lease.id, timeout)
        if answer.ttl <= 0:
            self.gone(lease, "etcd says the lease expired or was revoked", expired=True)
            return False
        if lease.gone:
            return False
        if self._stale(lease):
            # answered too late to be trusted: every hold under it is past its deadline
            self.gone(lease, "the keep-alive was answered after the lease time", expired=False)
            return False
        if sent > lease.confirmed_at:
            lease.confirmed_at = sent
            self.confirmed_at = max(self.confirmed_at, sent)
        return True

    def gone(self, lease: Lease, reason: str, *, expired: bool) -> None:
        """``lease`` is gone, or can no longer be trusted: its holds are lost, a new one will be granted."""
        if lease.gone:
            return
        lease.gone = True
        if self.current is lease:
            self.current = None
        # (INFO: each lock held under it says it is lost, and why, at WARNING)
        logger.info("etcd lease %x of %s lost: %s", lease.id, self._client.addresses, reason)
        if not expired and not self.closed:
            self._tasks.spawn(self._revoke(lease))
        self._on_gone(lease, reason, expired)
        self.wake()

    async def _revoke(self, lease: Lease) -> None:
        """Revoke a lease that may still live: its keys (of lost holds, and of waiters
        that queue again under the new lease) go at once instead of at its expiry."""
        with contextlib.suppress(LockError, OSError):
            await self._client.revoke(lease.id, self.window())

    def _stale(self, lease: Lease) -> bool:
        return asyncio.get_running_loop().time() >= lease.confirmed_at + self.lease_time(self._ttl)

    # -- keeping it alive ---------------------------------------------------------------------

    async def _keep(self) -> None:
        """Keep the lease alive while the client holds nothing (the watchdog does while it
        holds), declare it gone when nothing confirmed it in time, and grant a new one then."""
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        backoff = Backoff()
        retry_at = 0.0
        refused: str | None = None  # the refusal last logged: the same again is not news
        while not self.closed:
            lease = self.usable()
            now = loop.time()
            if lease is None:
                try:
                    await self.ensure(now + self.lease_time(self._ttl))
                    backoff.reset()
                    refused = None
                except ConfigurationError as exc:
                    level = logging.DEBUG if str(exc) == refused else logging.WARNING
                    logger.log(level, "etcd refused a lease: %s", exc)
                    refused = str(exc)
                    await asyncio.sleep(self.lease_time(self._ttl))
                except (LockError, OSError) as exc:
                    logger.debug("etcd lease grant failed, retrying: %s", said(exc))
                    await asyncio.sleep(backoff.next())
                continue
            lease_time = self.lease_time(self._ttl)
            stale_at = lease.confirmed_at + lease_time
            # While it holds, the watchdog's renewals keep the lease alive, and the front
            # loses its holds at their deadlines if they fail; a request that finds the
            # lease stale declares it gone (usable()). Look again once it must be gone,
            # should nothing ask.
            holding = self._holding()
            due = stale_at + lease_time if holding else max(lease.confirmed_at + lease_time / 3, retry_at)
            if now < due:
                wake.clear()
                self._behind_watchdog = holding
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(due):
                            await wake.wait()
                finally:
                    self._behind_watchdog = False
                continue
            if now >= stale_at:
                continue  # declared gone by usable() at the top
            try:
                await self.keepalive(lease, min(self.window(), stale_at - now))
            except (LockError, OSError) as exc:
                logger.debug("etcd keep-alive failed, retrying: %s", said(exc))
                retry_at = loop.time() + backoff.next()
                continue
            backoff.reset()
            retry_at = 0.0

    async def aclose(self) -> None:
        """Stop keeping the lease alive and revoke it (etcd deletes every key of it at once), bounded."""
        self.closed = True
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        lease, self.current = self.current, None
        if lease is not None:
            lease.gone = True
            with contextlib.suppress(LockError, OSError):
                await self._client.revoke(lease.id, self.window())
        await self._tasks.aclose(within=self.window())
