"""etcd's authentication: a user and a password get a token, sent with every request.

etcd lets a token expire (``--auth-token-ttl``; a simple token also dies with
the member that issued it): a request refused for it did nothing, so the
client logs in again and sends it once more. One login serves every caller
that found the same token stale.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._channel import Endpoint
from ._replies import parse_token
from ._wire import authenticate_request

__all__ = ["Login"]

_AUTH = "/etcdserverpb.Auth/Authenticate"


class Login:
    """The token of ``user`` (none without a user: etcd's auth is off)."""

    def __init__(self, user: str | None, password: str | None) -> None:
        self.user = user
        self._password = password
        self.token: str | None = None
        #: what every request carries: the token, once logged in
        self.metadata: tuple[tuple[str, str], ...] = ()
        self._lock: asyncio.Lock | None = None

    def expired(self, exc: Any) -> bool:
        """Whether ``exc`` (a grpc error) is etcd refusing the token as expired."""
        return (
            self.user is not None
            and exc.code().name in ("UNAUTHENTICATED", "INVALID_ARGUMENT")
            and "invalid auth token" in (exc.details() or "").lower()
        )

    async def log_in(self, endpoint: Endpoint, timeout: float, stale: str | None = None) -> None:
        """Get a token for the user from ``endpoint`` (once for every caller that found ``stale`` stale).

        Raises ConfigurationError when etcd refuses the credentials, and what
        the member's edge makes of any other failure (:mod:`._errors`).
        """
        if self.user is None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.token is not None and self.token != stale:
                return
            request = authenticate_request(self.user, self._password or "")
            with endpoint.edge:
                answer = await endpoint.unary(_AUTH)(request, timeout=max(timeout, 0.001))
            self.token = parse_token(answer)
            self.metadata = (("token", self.token),)
