"""What the Redis family reads from its URLs and keywords, checked before any I/O.

redis-py takes most options either as a keyword or as a URL query parameter;
which ones it takes is read from its own signatures (:func:`accepted`), so a
name neither asynclock nor redis-py knows is refused with the closest valid
one, and a new redis-py option works without a change here. The refusal
lists asynclock's options, as the docs do, and says the rest go to redis-py
(its signatures hold dozens of names, internals among them).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Iterable
from typing import Any
from urllib.parse import unquote

try:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'asynclock[redis]'") from exc

from ..._options import mask_url, query_names, reject_unknown, whole

__all__ = [
    "OWN_OPTIONS",
    "REDIS_PY_OPTIONS",
    "accepted",
    "check_options",
    "check_replicas",
    "connection_options",
    "database",
    "replica_options",
    "url_value",
]

#: Query parameters and keyword options that the redis:// backend reads itself.
OWN_OPTIONS = ("replicas", "replica_timeout")
#: What an unknown-option message says of the options that go on to redis-py.
REDIS_PY_OPTIONS = "and what redis-py's Redis.from_url takes, such as socket_timeout, ssl_ca_certs or password"


def accepted(*targets: Callable[..., Any]) -> dict[str, Any]:
    """The keyword options the ``targets`` take, with their defaults, read from their signatures.

    A class contributes its ``__init__`` and, as long as that passes
    ``**kwargs`` on, its bases' (redis-py's connection classes do so).
    """
    found: dict[str, Any] = {}
    for target in targets:
        functions = (
            [klass.__dict__["__init__"] for klass in target.__mro__ if "__init__" in klass.__dict__]
            if isinstance(target, type)
            else [target]
        )
        for function in functions:
            params = inspect.signature(function).parameters.values()
            for param in params:
                named = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
                if named and param.name not in ("self", "cls"):
                    found.setdefault(param.name, param.default)
            if not any(param.kind == param.VAR_KEYWORD for param in params):
                break
    return found


def connection_options(connection_class: type) -> dict[str, Any]:
    """What ``redis.asyncio.Redis.from_url`` takes (keyword or URL parameter) for ``connection_class``."""
    found = accepted(aioredis.Redis.from_url, aioredis.ConnectionPool, connection_class)
    found.pop("url", None)
    return found


def check_options(
    url: str,
    options: Iterable[str],
    valid: Collection[str],
    where: str,
    *,
    passed_on: Collection[str] = (),
    others: str = "",
) -> None:
    """ValueError for an unknown query parameter of ``url`` or keyword in ``options``.

    ``valid``: asynclock's own options here (those every client takes are
    added); ``passed_on``: redis-py's, which ``others`` names in words (see
    ``reject_unknown``).
    """
    reject_unknown(query_names(url), valid, where, passed_on=passed_on, others=others)
    reject_unknown(options, valid, where, keywords=True, passed_on=passed_on, others=others)


def url_value(name: str, text: str, default: object = None) -> Any:
    """A URL parameter's text as the type redis-py wants (its own URL parsers, else the default's type)."""
    parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
    try:
        if parser is not None:
            return parser(text)
        if isinstance(default, bool):
            return text.strip().upper() not in ("0", "F", "FALSE", "N", "NO", "")
        if isinstance(default, (int, float)):
            return type(default)(text)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {name!r} in the URL: {text!r}") from None
    return text


def database(path: str, url: str) -> int | None:
    """The database number of a redis:// URL's path (None without one); ValueError if it is not a number."""
    text = unquote(path).strip("/")
    if not text:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(
            f"the database of a Redis URL is a number (redis://host:port/0), got {text!r} in {mask_url(url)}"
        )
    return int(text)


def check_replicas(replicas: object, replica_timeout: object) -> None:
    """ValueError unless ``replicas`` is a whole number >= 0 and ``replica_timeout`` a positive number of seconds."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be a whole number >= 0, got {replicas!r}")
    if (
        isinstance(replica_timeout, bool)
        or not isinstance(replica_timeout, (int, float))
        or not 0 < replica_timeout < float("inf")
    ):
        raise ValueError(f"replica_timeout must be a positive number of seconds, got {replica_timeout!r}")


def replica_options(options: dict[str, Any], own: dict[str, str]) -> tuple[int, float]:
    """``replicas`` and ``replica_timeout`` from keywords (popped) or URL text, checked."""
    replicas: Any = options.pop("replicas", own.get("replicas", 0))
    replica_timeout: Any = options.pop("replica_timeout", own.get("replica_timeout", 0.5))
    if isinstance(replicas, str):
        replicas = whole(replicas, "replicas")
    if isinstance(replica_timeout, str):
        try:
            replica_timeout = float(replica_timeout)
        except ValueError:
            raise ValueError(f"replica_timeout must be a number of seconds, got {replica_timeout!r}") from None
    check_replicas(replicas, replica_timeout)
    return replicas, replica_timeout
