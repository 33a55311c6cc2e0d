"""A ``mysql://`` (or ``mariadb://``) URL and its options, checked before any I/O.

``mysql://user:password@host:3306/database?table=…&max_leases=…`` (the port
defaults to 3306; the database is required: the fence table lives there).
Query parameters: asynclock's own (``table``, ``max_leases``) and
``unix_socket`` (a path: connect through it instead of TCP; messages then
name the socket). Keyword options: the same, and what goes to asyncmy's
``connect`` as it is: ``user``, ``password``, ``ssl`` (an ``ssl.SSLContext``),
``server_public_key``, ``program_name``. Anything else raises ValueError
naming the valid ones. The session's character set is always utf8mb4 and
its autocommit on (asynclock chooses them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._options import host_list, reject_unknown

__all__ = ["CONNECT_OPTIONS", "OWN_OPTIONS", "QUERY_OPTIONS", "Settings", "parse_url"]

#: asynclock's own options (``ttl``, ``prefix`` and ``connect_timeout`` are read by ``connect()``).
OWN_OPTIONS = frozenset({"ttl", "prefix", "connect_timeout", "table", "max_leases"})
#: Keyword options that go to asyncmy's ``connect`` as they are.
CONNECT_OPTIONS = frozenset({"user", "password", "ssl", "server_public_key", "program_name", "unix_socket"})
#: URL query parameters.
QUERY_OPTIONS = frozenset({"table", "max_leases", "unix_socket"})

DEFAULT_PORT = 3306


@dataclass(frozen=True)
class Settings:
    """What a session connects with, and the names messages use (never the password)."""

    host: str
    port: int
    database: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    #: more keyword arguments of asyncmy's ``connect`` (ssl, unix_socket, …)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` (or the unix socket's path), as messages name the server."""
        socket = self.extra.get("unix_socket")
        if socket:
            return str(socket)
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def secrets(self) -> list[str]:
        """What no message may show."""
        return [self.password] if self.password else []

    def connect_kwargs(self, connect_timeout: float) -> dict[str, Any]:
        """The keyword arguments of ``asyncmy.connect`` for one session."""
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "database": self.database,
            "charset": "utf8mb4",
            "autocommit": True,
            "connect_timeout": connect_timeout,
        }
        if self.user is not None:
            kwargs["user"] = self.user
        if self.password is not None:
            kwargs["password"] = self.password
        kwargs.update(self.extra)
        return kwargs


def parse_url(url: str, options: dict[str, Any]) -> tuple[Settings, dict[str, str]]:
    """The connection settings of ``url`` with the keyword ``options`` (those asyncmy takes are
    taken out of it), and asynclock's own query parameters (``table``, ``max_leases``)."""
    reject_unknown(options, OWN_OPTIONS | CONNECT_OPTIONS, "mysql://")
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"not a mysql:// or mariadb:// URL: {parts.scheme}://…")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    reject_unknown(query, QUERY_OPTIONS, "mysql:// URLs")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError("a mysql:// URL needs a host: mysql://user:password@host:3306/database")
    ((host, port),) = host_list(hosts, url, "a mysql:// URL's server", default_port=DEFAULT_PORT)
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ValueError("a mysql:// URL names its database: mysql://user:password@host:3306/database")
    user, _, password = userinfo.partition(":")
    extra: dict[str, Any] = {}
    for name in CONNECT_OPTIONS - {"user", "password"}:
        if name in options:
            extra[name] = options.pop(name)
    if "unix_socket" in query:
        extra["unix_socket"] = query.pop("unix_socket")
    settings = Settings(
        host=host,
        port=port,
        database=database,
        user=options.pop("user", unquote(user) if user else None),
        password=options.pop("password", unquote(password) if password else None),
        extra=extra,
    )
    return settings, {name: value for name, value in query.items() if name in ("table", "max_leases")}
