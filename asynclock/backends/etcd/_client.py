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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

try:
    import grpc
    import grpc.aio
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the etcd backend needs grpcio: pip install 'asynclock[etcd]'") from exc

from ..._errors import BackendUnavailable, ConfigurationError, LockError
from . import _wire

__all__ = ["EtcdClient", "EtcdError", "EtcdUnavailable", "TlsOptions", "Watch"]

logger = logging.getLogger("asynclock")

T = TypeVar("T")

_KV = "/etcdserverpb.KV/"
_LEASE = "/etcdserverpb.Lease/"
_WATCH = "/etcdserverpb.Watch/Watch"
_AUTH = "/etcdserverpb.Auth/Authenticate"

#: gRPC channel settings: reconnect quickly after a member comes back (the
#: default backoff grows to two minutes), and cap what a reply may carry.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]
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


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """What ``etcds://`` connects with: a CA file (None: the system's roots), and a client
    certificate and key for servers that ask for one."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> Any:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except OSError as exc:
                raise ConfigurationError(f"etcd TLS: cannot read {path}: {exc.strerror}") from exc

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


#: status codes that say "this member could not serve it now": try another one
_MEMBER_TROUBLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL", "ABORTED"})
#: what etcd says when a credential or a permission is refused
_REFUSED = ("authentication failed", "permission denied", "user name is empty", "user name not found")


class Watch:
    """One watch of a key (or a range): ``fired`` is set once, with ``reason``
    ``"deleted"`` or ``"lost"``."""

    __slots__ = ("created", "fired", "key", "range_end", "reason", "start_revision", "watch_id")

    def __init__(self, key: bytes, range_end: bytes, start_revision: int) -> None:
        self.key = key
        self.range_end = range_end
        self.start_revision = start_revision
        self.watch_id: int | None = None
        self.created = False
        self.fired = asyncio.Event()
        self.reason = ""

    def fire(self, reason: str) -> None:
        if not self.fired.is_set():
            self.reason = reason
            self.fired.set()


class _Endpoint:
    """One member's address and its gRPC channel (made on first use)."""

    def __init__(self, host: str, port: int, tls: TlsOptions | None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.channel: Any = None
        self._methods: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def unary(self, path: str) -> Any:
        method = self._methods.get(path)
        if method is None:
            method = self._methods[path] = self._channel().unary_unary(path)
        return method

    def stream(self, path: str) -> Any:
        return self._channel().stream_stream(path)

    def _channel(self) -> Any:
        if self.channel is None:
            options = list(_CHANNEL_OPTIONS)
            if self.tls is None:
                self.channel = grpc.aio.insecure_channel(self.address, options=options)
            else:
                if self.tls.server_name:
                    options.append(("grpc.ssl_target_name_override", self.tls.server_name))
                self.channel = grpc.aio.secure_channel(self.address, self.tls.credentials(), options=options)
        return self.channel

    async def close(self) -> None:
        channel, self.channel = self.channel, None
        self._methods.clear()
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close(grace=None)


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
        self._endpoints = [_Endpoint(host, port, tls) for host, port in endpoints]
        self._index = random.randrange(len(self._endpoints))
        self._user = user
        self._password = password
        self._token: str | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._auth_lock: asyncio.Lock | None = None
        # the keep-alive stream: one request and its answer at a time
        self._ka_call: Any = None
        self._ka_endpoint: _Endpoint | None = None
        self._ka_lock: asyncio.Lock | None = None
        # the watch stream and its watches
        self._watch_call: Any = None
        self._watch_reader: asyncio.Task[None] | None = None
        self._watch_lock: asyncio.Lock | None = None
        self._watches: dict[int, Watch] = {}
        self._creating: deque[Watch] = deque()
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

    # -- errors ------------------------------------------------------------------------

    def _translate(self, exc: BaseException, endpoint: _Endpoint) -> LockError:
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

    def _rotate(self, endpoint: _Endpoint) -> None:
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
                raise self._translate(exc, endpoint) from exc
            except Exception as exc:  # any other failure of grpc (a closed channel, …) is ours too
                raise self._translate(exc, endpoint) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _token_expired(self, exc: Any) -> bool:
        return (
            self._user is not None
            and exc.code().name in ("UNAUTHENTICATED", "INVALID_ARGUMENT")
            and "invalid auth token" in (exc.details() or "").lower()
        )

    async def _authenticate(self, endpoint: _Endpoint, timeout: float, stale: str | None = None) -> None:
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
                raise self._translate(exc, endpoint) from exc
            self._token = _wire.parse_token(answer)
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
        delay = 0.02
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
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)
        raise EtcdUnavailable(f"no etcd member of {self.addresses} answered within {timeout:g}s: {last}") from last

    async def range(self, request: bytes, timeout: float) -> _wire.RangeResult:
        return _wire.RangeResult.parse(await self.call(_KV + "Range", request, timeout))

    async def txn(
        self,
        compares: Sequence[_wire.Compare],
        success: Sequence[_wire.Op],
        failure: Sequence[_wire.Op] = (),
        *,
        timeout: float,
    ) -> _wire.TxnResult:
        request = _wire.txn_request(compares, success, failure)
        return _wire.TxnResult.parse(await self.call(_KV + "Txn", request, timeout))

    async def delete(self, key: bytes, timeout: float, range_end: bytes = b"") -> _wire.RangeResult:
        """Delete ``key`` (or the range); ``count`` of the answer is how many keys went."""
        return _wire.parse_delete(await self.call(_KV + "DeleteRange", _wire.delete_request(key, range_end), timeout))

    async def grant(self, ttl: int, lease_id: int, timeout: float) -> _wire.LeaseResult:
        """Grant the lease ``lease_id`` (chosen by the caller, so a repeated grant is recognised)."""
        return _wire.LeaseResult.parse(
            await self.call(_LEASE + "LeaseGrant", _wire.lease_grant_request(ttl, lease_id), timeout)
        )

    async def revoke(self, lease_id: int, timeout: float) -> None:
        await self.call(_LEASE + "LeaseRevoke", _wire.lease_id_request(lease_id), timeout)

    async def time_to_live(self, lease_id: int, timeout: float) -> _wire.LeaseResult:
        return _wire.LeaseResult.parse(
            await self.call(_LEASE + "LeaseTimeToLive", _wire.lease_ttl_request(lease_id), timeout)
        )

    # -- keep-alive ----------------------------------------------------------------------

    async def keepalive(self, lease_id: int, timeout: float) -> _wire.LeaseResult:
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
                metadata = (*self._metadata, _REQUIRE_LEADER)
                self._ka_call = endpoint.stream(_LEASE + "LeaseKeepAlive")(metadata=metadata)
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
                    raise self._translate(exc, endpoint) from exc
                raise
            if answer is grpc.aio.EOF:
                self._drop_keepalive()
                self._rotate(endpoint)
                raise EtcdUnavailable(f"etcd at {endpoint.address} closed the keep-alive stream")
            return _wire.LeaseResult.parse(answer)
        finally:
            self._ka_lock.release()

    def _drop_keepalive(self) -> None:
        call, self._ka_call, self._ka_endpoint = self._ka_call, None, None
        if call is not None:
            call.cancel()

    # -- watches ---------------------------------------------------------------------------

    async def watch(self, key: bytes, start_revision: int, timeout: float, range_end: bytes = b"") -> Watch:
        """Watch ``key`` (or the range up to ``range_end``) for deletions from
        ``start_revision`` on; returns once etcd confirmed the watch (or it fired)."""
        self._check_open()
        if self._watch_lock is None:
            self._watch_lock = asyncio.Lock()
        watch = Watch(key, range_end, start_revision)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with asyncio.timeout_at(deadline):
            await self._watch_lock.acquire()
        try:
            endpoint = self._endpoints[self._index]
            try:
                async with asyncio.timeout_at(deadline):
                    if self._watch_call is None:
                        metadata = (*self._metadata, _REQUIRE_LEADER)
                        call = endpoint.stream(_WATCH)(metadata=metadata)
                        self._watch_call = call
                        self._watch_reader = loop.create_task(
                            self._read_watches(call, endpoint), name="asynclock-etcd-watch"
                        )
                    self._creating.append(watch)
                    self.requests += 1
                    request = _wire.watch_create_request(
                        key, range_end, start_revision=start_revision, filters=(_wire.NOPUT,)
                    )
                    await self._watch_call.write(request)
            except BaseException as exc:
                self._fail_watches(f"watch request failed: {exc!r}")
                if isinstance(exc, Exception):
                    raise self._translate(exc, endpoint) from exc
                raise
        finally:
            self._watch_lock.release()
        return watch

    async def unwatch(self, watch: Watch) -> None:
        """Stop a watch (best effort: a watch that already fired or whose stream is gone needs nothing)."""
        watch.fire("cancelled")
        if watch.watch_id is None or self._watches.get(watch.watch_id) is not watch:
            return
        del self._watches[watch.watch_id]
        call = self._watch_call
        if call is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(0.5):
                await call.write(_wire.watch_cancel_request(watch.watch_id))

    async def _read_watches(self, call: Any, endpoint: _Endpoint) -> None:
        reason = "the watch stream ended"
        try:
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    break
                self._on_watch(_wire.WatchResult.parse(answer))
        except asyncio.CancelledError:
            reason = "the watch stream was closed"
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the stream ends every watch on it
            reason = f"the watch stream failed: {exc!r}"
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code().name != "CANCELLED":
                self._translate(exc, endpoint)
        finally:
            if self._watch_call is call:
                self._fail_watches(reason)

    def _on_watch(self, result: _wire.WatchResult) -> None:
        if result.created:
            watch = self._creating.popleft() if self._creating else None
            if watch is None:
                return
            if result.canceled:
                watch.fire("lost")
                return
            watch.watch_id = result.watch_id
            watch.created = True
            if watch.fired.is_set():
                # unwatched before etcd confirmed it: cancel it on the server
                self._cancel_later(result.watch_id)
                return
            self._watches[result.watch_id] = watch
        watch = self._watches.get(result.watch_id)
        if watch is None:
            return
        if result.canceled or result.compact_revision:
            del self._watches[result.watch_id]
            watch.fire("lost")
            return
        if any(event.type == _wire.DELETE for event in result.events):
            del self._watches[result.watch_id]
            watch.fire("deleted")
            self._cancel_later(result.watch_id)

    def _cancel_later(self, watch_id: int) -> None:
        call = self._watch_call
        if call is None:
            return

        async def cancel() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(0.5):
                    await call.write(_wire.watch_cancel_request(watch_id))

        task = asyncio.get_running_loop().create_task(cancel(), name="asynclock-etcd-unwatch")
        task.add_done_callback(_quiet)

    def _fail_watches(self, reason: str) -> None:
        call, self._watch_call = self._watch_call, None
        reader, self._watch_reader = self._watch_reader, None
        if call is not None:
            call.cancel()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        watches = [*self._watches.values(), *self._creating]
        self._watches.clear()
        self._creating.clear()
        if watches:
            logger.debug("etcd: %d watches lost: %s", len(watches), reason)
        for watch in watches:
            watch.fire("lost")

    # -- life cycle --------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_keepalive()
        reader = self._watch_reader
        self._fail_watches("the client was closed")
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        for endpoint in self._endpoints:
            await endpoint.close()


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
