"""A thin etcd v3 client on grpc.aio: the calls the lock recipes make, bounded, with failover.

What it does, and why it is ours rather than a general client's:

* Every request has a deadline given by its caller, and nothing is re-sent
  by this layer: a request that fails raises :class:`EtcdUnavailable` and the
  caller decides (every request the recipes send is safe to repeat: a
  create is conditional on the key being absent, a delete names its key).
* Several endpoints: requests go to one member; a failure that may be the
  member's (unreachable, no leader, timed out) moves the next request to
  the next endpoint, so a dead or partitioned member costs one failed
  request, not a stall.
* One ``LeaseKeepAlive`` stream carries every keep-alive of the client's
  lease, one request and its answer at a time.
* One ``Watch`` stream carries every watch; each watch fires once, with
  ``"deleted"`` (a delete event of its key or range), or ``"lost"`` (the
  stream broke, the watch was cancelled or its revision compacted: the
  watcher reads again, as after any reconnect).
* Authentication: a user and password get a token (``Authenticate``) sent
  with every request; an expired token is renewed once, transparently
  (:mod:`._auth`). Refused credentials or permissions raise
  :class:`~asynclock.ConfigurationError`.

Errors: gRPC's become ours at the edge of the member a request went to
(``Endpoint.edge``, :mod:`._errors`); nothing of grpc leaks out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from ..._errors import ConfigurationError, LockError
from ..._timing import Backoff
from ._auth import Login
from ._channel import Endpoint, TlsOptions
from ._errors import EtcdError, EtcdUnavailable
from ._replies import LeaseResult, RangeResult, TxnResult, deleted_count, parse_delete
from ._watch import Watch, Watches
from ._wire import (
    Compare,
    Op,
    delete_request,
    lease_grant_request,
    lease_id_request,
    lease_ttl_request,
    range_request,
    txn_request,
)

__all__ = ["EtcdClient", "EtcdError", "EtcdUnavailable", "TlsOptions", "Watch"]

logger = logging.getLogger("asynclock")

_KV = "/etcdserverpb.KV/"
_LEASE = "/etcdserverpb.Lease/"

#: Metadata that makes a member refuse a stream while it has no leader
#: (otherwise a member cut off from the others keeps a watch open and silent).
_REQUIRE_LEADER = ("hasleader", "true")


class EtcdClient:
    """Requests to an etcd cluster through one of ``endpoints`` at a time."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        tls: TlsOptions | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        self._endpoints = [Endpoint(host, port, tls, on_trouble=self._rotate) for host, port in endpoints]
        self._index = random.randrange(len(self._endpoints))
        self._login = Login(user, password)
        # the keep-alive stream: one request and its answer at a time
        self._ka_call: Any = None
        self._ka_endpoint: Endpoint | None = None
        self._ka_lock: asyncio.Lock | None = None
        self._watches = Watches(self)
        self._closed = False
        #: requests sent (for tests and benchmarks)
        self.requests = 0

    def __repr__(self) -> str:
        return f"<EtcdClient {self.addresses}>"

    @property
    def addresses(self) -> str:
        return ",".join(endpoint.address for endpoint in self._endpoints)

    @property
    def current(self) -> str:
        """The address requests go to now."""
        return self._endpoints[self._index].address

    @property
    def endpoint(self) -> Endpoint:
        """The member requests go to now."""
        return self._endpoints[self._index]

    @property
    def stream_metadata(self) -> tuple[tuple[str, str], ...]:
        """What a stream is opened with: the auth token, and "only a member that has a leader"."""
        return (*self._login.metadata, _REQUIRE_LEADER)

    def _rotate(self, endpoint: Endpoint) -> None:
        """``endpoint`` is in trouble: if requests go to it, the next ones go to the next member."""
        if self._endpoints[self._index] is endpoint and len(self._endpoints) > 1:
            self._index = (self._index + 1) % len(self._endpoints)
            logger.debug("etcd: %s failed, next requests go to %s", endpoint.address, self.current)

    def _check_open(self) -> None:
        if self._closed:
            raise EtcdUnavailable("the etcd client is closed")

    # -- unary requests ------------------------------------------------------------------

    async def call(self, path: str, request: bytes, timeout: float) -> bytes:
        """Send one unary request to the current member; its raw answer.

        An expired auth token is renewed and the request sent once more (it
        was refused, so it did nothing). Every failure is ours (:mod:`._errors`).
        """
        self._check_open()
        endpoint = self._endpoints[self._index]
        login = self._login
        with endpoint.edge:
            try:
                self.requests += 1
                answer: bytes = await endpoint.unary(path)(
                    request, timeout=max(timeout, 0.001), metadata=login.metadata
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                if not login.expired(exc):
                    raise
            await login.log_in(endpoint, timeout, stale=login.token)
            self.requests += 1
            answer = await endpoint.unary(path)(request, timeout=max(timeout, 0.001), metadata=login.metadata)
            return answer

    def send(self, path: str, request: bytes, timeout: float) -> Sent:
        """Send one unary request that goes on if its caller stops waiting (see :class:`Sent`)."""
        self._check_open()
        self.requests += 1
        endpoint = self._endpoints[self._index]
        call = endpoint.unary(path)(request, timeout=max(timeout, 0.001), metadata=self._login.metadata)
        return Sent(self, endpoint, call, path, request, timeout)

    async def _answer(self, sent: Sent) -> bytes:
        """The answer of a finished :class:`Sent`, or its error as ours."""
        call = sent.call
        if call.cancelled():  # only closing the channel cancels it
            raise EtcdUnavailable(f"etcd at {sent.endpoint.address}: the request was cancelled (client closed)")
        with sent.endpoint.edge:
            try:
                answer: bytes = await call
                return answer
            except grpc.aio.AioRpcError as exc:
                if not self._login.expired(exc):
                    raise
        # refused, so it did nothing: log in again and send it once more
        await self._login.log_in(sent.endpoint, sent.timeout, stale=self._login.token)
        return await self.call(sent.path, sent.request, sent.timeout)

    async def connect(self, timeout: float) -> None:
        """Reach one member (and log in): every endpoint in turn until ``timeout``.

        Raises BackendUnavailable naming every address when none answered,
        ConfigurationError when one refused the credentials.
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: BaseException | None = None
        refused: set[str] = set()  # members that refused the connection outright: none serves there
        backoff = Backoff()
        while True:
            endpoint = self._endpoints[self._index]
            left = deadline - loop.time()
            if left <= 0:
                break
            per_try = max(0.05, min(left, timeout / len(self._endpoints)))
            try:
                if self._login.user is not None:
                    self._login.token = None
                    await self._login.log_in(endpoint, per_try)
                else:
                    # any cheap request proves the member serves (a serializable read)
                    await self.call(_KV + "Range", range_request(b"\x00", count_only=True), per_try)
                return
            except ConfigurationError:
                raise
            except LockError as exc:
                last = exc
                if "connection refused" in str(exc).lower():
                    refused.add(endpoint.address)
                if self._endpoints[self._index] is endpoint:
                    self._rotate(endpoint)
                if len(refused) == len(self._endpoints):
                    # Nothing listens at any address: waiting out the timeout cannot help.
                    error = EtcdUnavailable(f"no etcd member of {self.addresses} could be reached: {exc}")
                    error.connect_timeout = timeout
                    raise error from exc
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.sleep(min(backoff.next(), left))
        raise EtcdUnavailable(f"no etcd member of {self.addresses} answered within {timeout:g}s: {last}") from last

    async def range(self, request: bytes, timeout: float) -> RangeResult:
        return RangeResult.parse(await self.call(_KV + "Range", request, timeout))

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
        *,
        timeout: float,
    ) -> TxnResult:
        request = txn_request(compares, success, failure)
        return TxnResult.parse(await self.call(_KV + "Txn", request, timeout))

    def send_txn(self, request: bytes, *, timeout: float) -> Sent:
        """A transaction (a ``txn_request``) that goes on if its caller stops waiting;
        ``TxnResult.parse`` its answer."""
        return self.send(_KV + "Txn", request, timeout)

    async def delete(self, key: bytes, timeout: float, range_end: bytes = b"") -> RangeResult:
        """Delete ``key`` (or the range); ``count`` of the answer is how many keys went."""
        return parse_delete(await self.call(_KV + "DeleteRange", delete_request(key, range_end), timeout))

    async def remove(self, request: bytes, timeout: float) -> int:
        """Send an encoded ``delete_request``; how many keys went."""
        return deleted_count(await self.call(_KV + "DeleteRange", request, timeout))

    async def grant(self, ttl: int, lease_id: int, timeout: float) -> LeaseResult:
        """Grant the lease ``lease_id`` (chosen by the caller, so a repeated grant is recognised)."""
        return LeaseResult.parse(await self.call(_LEASE + "LeaseGrant", lease_grant_request(ttl, lease_id), timeout))

    async def revoke(self, lease_id: int, timeout: float) -> None:
        await self.call(_LEASE + "LeaseRevoke", lease_id_request(lease_id), timeout)

    async def time_to_live(self, lease_id: int, timeout: float) -> LeaseResult:
        return LeaseResult.parse(await self.call(_LEASE + "LeaseTimeToLive", lease_ttl_request(lease_id), timeout))

    # -- keep-alive ----------------------------------------------------------------------

    async def keepalive(self, lease_id: int, timeout: float) -> LeaseResult:
        """One keep-alive of ``lease_id`` on the client's keep-alive stream; its answer
        (``ttl`` <= 0: the lease is gone). A stream that fails or does not answer in
        time is dropped, and the next keep-alive opens one to the next member."""
        self._check_open()
        if self._ka_lock is None:
            self._ka_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with asyncio.timeout_at(deadline):
            await self._ka_lock.acquire()
        try:
            endpoint = self._endpoints[self._index]
            if self._ka_call is None or self._ka_endpoint is not endpoint:
                self._drop_keepalive()
                self._ka_call = endpoint.stream(_LEASE + "LeaseKeepAlive")(metadata=self.stream_metadata)
                self._ka_endpoint = endpoint
            call = self._ka_call
            with endpoint.edge:
                try:
                    async with asyncio.timeout_at(deadline):
                        self.requests += 1
                        await call.write(lease_id_request(lease_id))
                        answer = await call.read()
                except BaseException as exc:
                    self._drop_keepalive()
                    if isinstance(exc, grpc.aio.AioRpcError) and self._login.expired(exc):
                        await self._login.log_in(endpoint, max(0.001, deadline - loop.time()), stale=self._login.token)
                    raise
            if answer is grpc.aio.EOF:
                self._drop_keepalive()
                self._rotate(endpoint)
                raise EtcdUnavailable(f"etcd at {endpoint.address} closed the keep-alive stream")
            return LeaseResult.parse(answer)
        finally:
            self._ka_lock.release()

    def _drop_keepalive(self) -> None:
        call, self._ka_call, self._ka_endpoint = self._ka_call, None, None
        if call is not None:
            call.cancel()

    # -- watches ---------------------------------------------------------------------------

    async def watch(
        self, key: bytes, start_revision: int, timeout: float, range_end: bytes = b"", *, events: bool = False
    ) -> Watch:
        """Watch ``key`` (or the range up to ``range_end``) for deletions from ``start_revision`` on
        (with ``events``: for every put and delete, kept in ``Watch.events``)."""
        self._check_open()
        return await self._watches.watch(key, start_revision, timeout, range_end, events=events)

    def unwatch(self, watch: Watch) -> None:
        """Stop a watch (etcd is told in the background)."""
        self._watches.unwatch(watch)

    # -- life cycle --------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_keepalive()
        await self._watches.close()
        for endpoint in self._endpoints:
            await endpoint.close()


class Sent:
    """A unary request that goes on when its caller stops waiting for it.

    A cancelled gRPC call may still be applied by etcd (the request may have
    reached it), and then nobody learns that it was. A create that lands
    unseen would leave a key, attached to the client's long-lived lease,
    blocking its lock. So a create is sent this way: cancelling the task that
    waits in :meth:`answer` leaves the request running to its answer (its own
    deadline bounds it), and whoever cleans up after the cancellation can
    :meth:`wait` for that answer and act on it. No task of our own: gRPC
    runs the call, and a done callback tells us it ended.
    """

    __slots__ = ("_ended", "call", "client", "endpoint", "path", "request", "timeout")

    def __init__(self, client: EtcdClient, endpoint: Endpoint, call: Any, path: str, request: bytes, timeout: float):
        self.client = client
        self.endpoint = endpoint
        self.call = call
        self.path = path
        self.request = request
        self.timeout = timeout
        self._ended: asyncio.Future[None] | None = None
        call.add_done_callback(self._finished)

    def _finished(self, call: Any) -> None:
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    def done(self) -> bool:
        return bool(self.call.done())

    async def _until_done(self) -> None:
        """Wait for the request to end; cancelling the caller ends this wait, not the request."""
        if self.call.done():
            return
        if self._ended is None or self._ended.done():
            self._ended = asyncio.get_running_loop().create_future()
        await self._ended

    async def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the request to end (without cancelling it); whether it did."""
        if not self.call.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._until_done()
        return self.done()

    async def answer(self) -> bytes:
        """Its answer; raises our errors. A cancelled caller leaves the request running."""
        await self._until_done()
        return await self.client._answer(self)
