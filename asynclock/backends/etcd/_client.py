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
  with every request; an expired token is renewed once, transparently.
  Refused credentials or permissions raise :class:`~asynclock.ConfigurationError`.

Errors: gRPC's are translated here; nothing of grpc leaks out.
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

from ..._errors import BackendUnavailable, ConfigurationError, LockError
from ..._timing import Backoff
from . import _replies, _wire
from ._channel import Endpoint, TlsOptions
from ._watch import Watch, Watches

__all__ = ["EtcdClient", "EtcdError", "EtcdUnavailable", "TlsOptions", "Watch"]

logger = logging.getLogger("asynclock")

_KV = "/etcdserverpb.KV/"
_LEASE = "/etcdserverpb.Lease/"
_AUTH = "/etcdserverpb.Auth/Authenticate"

#: Metadata that makes a member refuse a stream while it has no leader
#: (otherwise a member cut off from the others keeps a watch open and silent).
_REQUIRE_LEADER = ("hasleader", "true")


class EtcdError(LockError):
    """etcd refused a request; ``code`` is the gRPC status name, ``details`` etcd's words."""

    def __init__(self, code: str, details: str, address: str = "") -> None:
        self.code = code
        self.details = details
        where = f" ({address})" if address else ""
        super().__init__(f"etcd{where}: {details or code}")


class EtcdUnavailable(BackendUnavailable):
    """No answer from etcd in time (or the connection broke): the outcome is unknown."""


#: status codes that say "this member could not serve it now": try another one
_MEMBER_TROUBLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL", "ABORTED"})
#: what etcd says when a credential or a permission is refused
_REFUSED = ("authentication failed", "permission denied", "user name is empty", "user name not found")


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
        self._endpoints = [Endpoint(host, port, tls) for host, port in endpoints]
        self._index = random.randrange(len(self._endpoints))
        self._user = user
        self._password = password
        self._token: str | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._auth_lock: asyncio.Lock | None = None
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
        return (*self._metadata, _REQUIRE_LEADER)

    # -- errors ------------------------------------------------------------------------

    def translate(self, exc: BaseException, endpoint: Endpoint) -> LockError:
        """A grpc error as ours; moves later requests to the next member if this one is in trouble."""
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code().name
            details = exc.details() or ""
            lowered = details.lower()
            if code == "PERMISSION_DENIED" or any(words in lowered for words in _REFUSED):
                return ConfigurationError(f"etcd at {endpoint.address} refused this client: {details}")
            if code == "UNAVAILABLE" and ("certificate" in lowered or "handshake" in lowered or "ssl" in lowered):
                return ConfigurationError(f"etcd at {endpoint.address}: TLS failed: {details}")
            if code in _MEMBER_TROUBLE:
                self._rotate(endpoint)
                return EtcdUnavailable(f"etcd at {endpoint.address} did not answer: {details or code}")
            return EtcdError(code, details, endpoint.address)
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            self._rotate(endpoint)
            return EtcdUnavailable(f"etcd at {endpoint.address} did not answer in time")
        if isinstance(exc, OSError):
            self._rotate(endpoint)
            return EtcdUnavailable(f"etcd at {endpoint.address}: {exc!r}")
        return EtcdUnavailable(f"etcd at {endpoint.address}: {exc!r}")

    def _rotate(self, endpoint: Endpoint) -> None:
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
        was refused, so it did nothing).
        """
        self._check_open()
        endpoint = self._endpoints[self._index]
        for attempt in (0, 1):
            try:
                self.requests += 1
                answer: bytes = await endpoint.unary(path)(
                    request, timeout=max(timeout, 0.001), metadata=self._metadata
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                if attempt == 0 and self._token_expired(exc):
                    await self._authenticate(endpoint, timeout, stale=self._token)
                    continue
                raise self.translate(exc, endpoint) from exc
            except Exception as exc:  # any other failure of grpc (a closed channel, …) is ours too
                raise self.translate(exc, endpoint) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def send(self, path: str, request: bytes, timeout: float) -> Sent:
        """Send one unary request that goes on if its caller stops waiting (see :class:`Sent`)."""
        self._check_open()
        self.requests += 1
        endpoint = self._endpoints[self._index]
        call = endpoint.unary(path)(request, timeout=max(timeout, 0.001), metadata=self._metadata)
        return Sent(self, endpoint, call, path, request, timeout)

    async def _answer(self, sent: Sent) -> bytes:
        """The answer of a finished :class:`Sent`, or its error as ours."""
        call = sent.call
        if call.cancelled():  # only closing the channel cancels it
            raise EtcdUnavailable(f"etcd at {sent.endpoint.address}: the request was cancelled (client closed)")
        try:
            answer: bytes = await call
            return answer
        except grpc.aio.AioRpcError as exc:
            if not self._token_expired(exc):
                raise self.translate(exc, sent.endpoint) from exc
        except Exception as exc:  # any other failure of grpc is ours too
            raise self.translate(exc, sent.endpoint) from exc
        # refused, so it did nothing: log in again and send it once more
        await self._authenticate(sent.endpoint, sent.timeout, stale=self._token)
        return await self.call(sent.path, sent.request, sent.timeout)

    def _token_expired(self, exc: Any) -> bool:
        return (
            self._user is not None
            and exc.code().name in ("UNAUTHENTICATED", "INVALID_ARGUMENT")
            and "invalid auth token" in (exc.details() or "").lower()
        )

    async def _authenticate(self, endpoint: Endpoint, timeout: float, stale: str | None = None) -> None:
        """Get a token for the user (once for every caller that found it stale)."""
        if self._user is None:
            return
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return
            request = _wire.authenticate_request(self._user, self._password or "")
            try:
                answer = await endpoint.unary(_AUTH)(request, timeout=max(timeout, 0.001))
            except grpc.aio.AioRpcError as exc:
                raise self.translate(exc, endpoint) from exc
            self._token = _replies.parse_token(answer)
            self._metadata = (("token", self._token),)

    async def connect(self, timeout: float) -> None:
        """Reach one member (and log in): every endpoint in turn until ``timeout``.

        Raises BackendUnavailable naming every address when none answered,
        ConfigurationError when one refused the credentials.
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: BaseException | None = None
        backoff = Backoff()
        while True:
            endpoint = self._endpoints[self._index]
            left = deadline - loop.time()
            if left <= 0:
                break
            per_try = max(0.05, min(left, timeout / len(self._endpoints)))
            try:
                if self._user is not None:
                    self._token = None
                    await self._authenticate(endpoint, per_try)
                else:
                    # any cheap request proves the member serves (a serializable read)
                    await self.call(_KV + "Range", _wire.range_request(b"\x00", count_only=True), per_try)
                return
            except ConfigurationError:
                raise
            except LockError as exc:
                last = exc
                if self._endpoints[self._index] is endpoint:
                    self._rotate(endpoint)
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.sleep(min(backoff.next(), left))
        raise EtcdUnavailable(f"no etcd member of {self.addresses} answered within {timeout:g}s: {last}") from last

    async def range(self, request: bytes, timeout: float) -> _replies.RangeResult:
        return _replies.RangeResult.parse(await self.call(_KV + "Range", request, timeout))

    async def txn(
        self,
        compares: Sequence[_wire.Compare],
        success: Sequence[_wire.Op],
        failure: Sequence[_wire.Op] = (),
        *,
        timeout: float,
    ) -> _replies.TxnResult:
        request = _wire.txn_request(compares, success, failure)
        return _replies.TxnResult.parse(await self.call(_KV + "Txn", request, timeout))

    def send_txn(self, request: bytes, *, timeout: float) -> Sent:
        """A transaction (a ``txn_request``) that goes on if its caller stops waiting;
        ``TxnResult.parse`` its answer."""
        return self.send(_KV + "Txn", request, timeout)

    async def delete(self, key: bytes, timeout: float, range_end: bytes = b"") -> _replies.RangeResult:
        """Delete ``key`` (or the range); ``count`` of the answer is how many keys went."""
        return _replies.parse_delete(
            await self.call(_KV + "DeleteRange", _wire.delete_request(key, range_end), timeout)
        )

    async def remove(self, request: bytes, timeout: float) -> int:
        """Send an encoded ``delete_request``; how many keys went."""
        return _replies.deleted_count(await self.call(_KV + "DeleteRange", request, timeout))

    async def grant(self, ttl: int, lease_id: int, timeout: float) -> _replies.LeaseResult:
        """Grant the lease ``lease_id`` (chosen by the caller, so a repeated grant is recognised)."""
        return _replies.LeaseResult.parse(
            await self.call(_LEASE + "LeaseGrant", _wire.lease_grant_request(ttl, lease_id), timeout)
        )

    async def revoke(self, lease_id: int, timeout: float) -> None:
        await self.call(_LEASE + "LeaseRevoke", _wire.lease_id_request(lease_id), timeout)

    async def time_to_live(self, lease_id: int, timeout: float) -> _replies.LeaseResult:
        return _replies.LeaseResult.parse(
            await self.call(_LEASE + "LeaseTimeToLive", _wire.lease_ttl_request(lease_id), timeout)
        )

    # -- keep-alive ----------------------------------------------------------------------

    async def keepalive(self, lease_id: int, timeout: float) -> _replies.LeaseResult:
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
            try:
                async with asyncio.timeout_at(deadline):
                    self.requests += 1
                    await call.write(_wire.lease_id_request(lease_id))
                    answer = await call.read()
            except BaseException as exc:
                self._drop_keepalive()
                if isinstance(exc, grpc.aio.AioRpcError) and self._token_expired(exc):
                    await self._authenticate(endpoint, max(0.001, deadline - loop.time()), stale=self._token)
                if isinstance(exc, Exception):
                    raise self.translate(exc, endpoint) from exc
                raise
            if answer is grpc.aio.EOF:
                self._drop_keepalive()
                self._rotate(endpoint)
                raise EtcdUnavailable(f"etcd at {endpoint.address} closed the keep-alive stream")
            return _replies.LeaseResult.parse(answer)
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
