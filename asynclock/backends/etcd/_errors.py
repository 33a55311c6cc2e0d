"""What goes wrong talking to etcd, as asynclock's errors.

gRPC's errors never leave the backend: :func:`failure` says what each one
is (:class:`EtcdError` for a refusal, :class:`EtcdUnavailable` when the
outcome is unknown, ConfigurationError for refused credentials or TLS) and
whether the member that failed should be left for the next one.
"""

from __future__ import annotations

import asyncio

import grpc.aio

from ..._errors import BackendUnavailable, ConfigurationError, LockError, plain, shown_as

__all__ = ["EtcdError", "EtcdUnavailable", "failure", "said"]


@shown_as(LockError)
class EtcdError(LockError):
    """etcd refused a request; ``code`` is the gRPC status name, ``details`` etcd's words."""

    def __init__(self, code: str, details: str, address: str = "") -> None:
        self.code = code
        self.details = details
        where = f" ({address})" if address else ""
        super().__init__(f"etcd{where}: {details or code}")


@shown_as(BackendUnavailable)
class EtcdUnavailable(BackendUnavailable):
    """No answer from etcd in time (or the connection broke): the outcome is unknown."""


#: status codes that say "this member could not serve it now": try another one
_MEMBER_TROUBLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL", "ABORTED"})
#: what etcd says when a credential or a permission is refused
_REFUSED = ("authentication failed", "permission denied", "user name is empty", "user name not found")


def said(exc: BaseException) -> str:
    """What ``exc`` says went wrong, in words (a gRPC error's own text is a dump of its fields)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        details: str = exc.details() or exc.code().name.lower().replace("_", " ")
        return details
    return plain(exc)


def _unreached(details: str) -> str | None:
    """Why no connection could be made, from gRPC's details, or None if that is not what they say."""
    lowered = details.lower()
    if "connection refused" in lowered:
        return "connection refused"
    if "dns resolution failed" in lowered or "name or service not known" in lowered:
        return "name not resolved"
    return None


def failure(exc: BaseException, address: str) -> tuple[BaseException, bool]:
    """``exc``, raised by a request to the member at ``address``, as asynclock's error (one
    of ours is returned as it is), and whether that member is in trouble (the next
    requests had better go to another)."""
    if isinstance(exc, LockError):
        return exc, False
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code().name
        details = exc.details() or ""
        lowered = details.lower()
        if code == "PERMISSION_DENIED" or any(words in lowered for words in _REFUSED):
            return ConfigurationError(f"etcd at {address} refused this client: {details}"), False
        if code == "UNAVAILABLE" and ("certificate" in lowered or "handshake" in lowered or "ssl" in lowered):
            return ConfigurationError(f"etcd at {address}: TLS failed: {details}"), False
        if code in _MEMBER_TROUBLE:
            cause = _unreached(details)
            if cause is not None:
                return EtcdUnavailable(f"etcd at {address} could not be reached: {cause}"), True
            return EtcdUnavailable(f"etcd at {address} did not answer: {said(exc)}"), True
        return EtcdError(code, details, address), False
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return EtcdUnavailable(f"etcd at {address} did not answer in time"), True
    return EtcdUnavailable(f"etcd at {address}: {plain(exc)}"), isinstance(exc, OSError)
