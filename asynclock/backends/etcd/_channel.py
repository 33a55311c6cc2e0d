"""Where an etcd client connects: one member's address, its gRPC channel and its error edge, and TLS.

A channel is made on first use and reconnects by itself; its settings make
it come back quickly after a member restarts. A member's edge
(:attr:`Endpoint.edge`) is entered around every request sent to it: what
grpc raises becomes asynclock's error there, and a member in trouble is
reported (the client then sends the next requests to another one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from ..._errors import ConfigurationError
from .._edge import MapErrors
from ._errors import failure

__all__ = ["Endpoint", "TlsOptions"]

#: gRPC channel settings: reconnect quickly after a member comes back (the
#: default backoff grows to two minutes), and cap what a reply may carry.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
    # subchannels of this channel's own: gRPC shares them by address between channels otherwise,
    # and a new client would inherit another's back-off from a server that was down (refused at
    # once although the server is back)
    ("grpc.use_local_subchannel_pool", 1),
]


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


class Endpoint:
    """One member's address and its gRPC channel (made on first use).

    ``on_trouble(endpoint)`` is called when a request to it failed in a way
    that may be the member's (unreachable, no leader, timed out).
    """

    def __init__(self, host: str, port: int, tls: TlsOptions | None, on_trouble: Callable[[Endpoint], None]) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.channel: Any = None
        self._methods: dict[str, Any] = {}
        self._on_trouble = on_trouble
        #: ``with endpoint.edge:`` around a request to this member: any failure of it is ours
        self.edge = MapErrors(self.translate, catch=(Exception,))

    def translate(self, exc: BaseException) -> BaseException:
        """``exc``, raised by a request to this member, as asynclock's error (:func:`._errors.failure`)."""
        error, trouble = failure(exc, self.address)
        if trouble:
            self._on_trouble(self)
        return error

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
