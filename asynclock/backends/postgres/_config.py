"""A ``postgresql://`` URL and its options, checked before any I/O, and the address to name in errors."""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg

from ..._options import query_names, reject_unknown, take_query

__all__ = [
    "ASYNCPG_PRIVATE",
    "DSN_PARAMETERS",
    "OWN_OPTIONS",
    "POOL_CONNECT_ARGS",
    "POOL_CONNECT_KWARGS",
    "PROXY_CONNECTION",
    "dsn_address",
    "dsn_secrets",
    "parse_url",
    "pool_address",
]

#: asyncpg's private attributes the backend reads, since asyncpg has no public way to them:
#: the connection under a pool's proxy (requests skip the proxy's indirection), and what a
#: given pool connects with (the address and passwords its errors name, or hide).
PROXY_CONNECTION = "_con"
POOL_CONNECT_ARGS = "_connect_args"
POOL_CONNECT_KWARGS = "_connect_kwargs"
#: Each of them by the asyncpg class that has it: the one list a test checks against asyncpg.
ASYNCPG_PRIVATE: dict[str, tuple[str, ...]] = {
    "PoolConnectionProxy": (PROXY_CONNECTION,),
    "Pool": (POOL_CONNECT_ARGS, POOL_CONNECT_KWARGS),
}

#: asynclock's own options (``ttl``, ``prefix`` and ``connect_timeout`` are read
#: by ``connect()``, ``table`` and ``max_leases`` by the backend).
OWN_OPTIONS = frozenset({"ttl", "prefix", "connect_timeout", "table", "max_leases"})
#: The URL query parameters asyncpg reads itself; it sends every other one to
#: the server as a setting (``?application_name=app&search_path=s``), which the
#: server refuses (ConfigurationError) if it does not know it.
DSN_PARAMETERS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "passfile",
        "dbname",
        "database",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)
#: Pool sizes asynclock chooses itself (``max_leases=`` sizes the pool).
POOL_SIZES = frozenset({"min_size", "max_size", "init_size"})
#: What a server setting's name looks like (``search_path``, ``myapp.tenant``).
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")


@functools.cache
def keyword_options() -> frozenset[str]:
    """The keyword options of a ``postgresql://`` client: asynclock's own and those of
    ``asyncpg.create_pool`` and ``asyncpg.connect`` (from their signatures), less what
    asynclock chooses itself (the DSN, the pool's sizes, the loop)."""
    names = set(OWN_OPTIONS)
    for function in (asyncpg.create_pool, asyncpg.connect):
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
                names.add(parameter.name)
    return frozenset(names - POOL_SIZES - {"dsn", "loop"})


def parse_url(url: str, options: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Check ``url``'s query and the keyword ``options``; the DSN for asyncpg, and asynclock's own parameters.

    A query parameter that is none of ours or asyncpg's goes to the server
    as a setting, unless it looks like a typo of an option (``?max_lease=3``):
    then ValueError names the closest. So does an unknown keyword option.
    """
    for own in POOL_SIZES:
        if own in options:
            raise ValueError(f"{own} is chosen by asynclock; use max_leases= to size the pool")
    valid_query = OWN_OPTIONS | DSN_PARAMETERS
    for name in query_names(url):
        if name not in valid_query and _typo(name, valid_query):
            reject_unknown(
                [name],
                OWN_OPTIONS,
                "postgresql://",
                passed_on=DSN_PARAMETERS,
                others="and the connection parameters asyncpg reads, such as sslmode, sslrootcert, user or password;"
                " other names go to the server as settings",
            )
    reject_unknown(
        options,
        OWN_OPTIONS,
        "postgresql://",
        keywords=True,
        passed_on=keyword_options(),
        others="and what asyncpg.create_pool and asyncpg.connect take, such as password, ssl or server_settings",
    )
    # asyncpg would send our query parameters to the server as settings: take them out.
    return take_query(url, {"table", "max_leases"})


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from ``a`` to ``b``."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def _typo(name: str, valid: frozenset[str]) -> bool:
    """Whether a URL query parameter that is no option of ours or asyncpg's is a typo of one.

    Such a parameter would go to the server as a setting; it is refused here
    when it is no setting's name, or one or two edits away from a valid
    option (one for short names). No PostgreSQL setting is that close to one
    of these names, so real settings pass.
    """
    if not _SETTING_NAME.match(name):
        return True
    reach = 1 if len(name) <= 4 else 2
    return any(_edits(name.lower(), option) <= reach for option in valid)


def dsn_address(dsn: str) -> str:
    """The servers a DSN names (``host:port``, several with commas), without user or password."""
    try:
        parts = urlsplit(dsn)
        hosts = parts.netloc.rpartition("@")[2]
        if not hosts:
            query = dict(parse_qsl(parts.query))
            hosts = query.get("host", "") + (f":{query['port']}" if "port" in query else "")
    except ValueError:
        return "?"
    return hosts or "localhost"


def dsn_secrets(dsn: str | None, options: dict[str, Any]) -> list[str]:
    """The passwords a DSN and connect options carry (never to be shown)."""
    found = []
    password = options.get("password")
    if isinstance(password, str):
        found.append(password)
    if dsn:
        with contextlib.suppress(ValueError):
            parts = urlsplit(dsn)
            if parts.password:
                found += [parts.password, unquote(parts.password)]
            found += [value for key, value in parse_qsl(parts.query) if key in ("password", "sslpassword")]
    return [secret for secret in found if secret]


def pool_address(pool: Any) -> tuple[str, list[str]]:
    """The address a given pool connects to, and its passwords, as far as asyncpg tells."""
    args = getattr(pool, POOL_CONNECT_ARGS, None) or [None]
    kwargs = dict(getattr(pool, POOL_CONNECT_KWARGS, None) or {})
    dsn = args[0] if isinstance(args[0], str) else None
    secrets = dsn_secrets(dsn, kwargs)
    host, port = kwargs.get("host"), kwargs.get("port")
    if isinstance(host, str) and host:
        return (f"{host}:{port}" if port else host), secrets
    return (dsn_address(dsn) if dsn else "the pool's server"), secrets
