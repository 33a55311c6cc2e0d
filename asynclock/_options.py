"""Options from ``connect()`` keywords and URL query strings, checked before any I/O.

One place for what every backend needs when it reads its URL: taking its
own parameters out of the query string, refusing unknown ones with the
closest valid name, turning URL text into numbers, and hiding passwords in
anything that is printed or raised.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

#: Default of the ``connect_timeout`` option, in seconds.
DEFAULT_CONNECT_TIMEOUT = 5.0

#: What a password is shown as.
MASK = "***"

#: Options every backend takes from ``connect()`` or the URL: part of each backend's valid set.
COMMON_OPTIONS = frozenset({"ttl", "prefix", "connect_timeout"})


def suggest(name: str, valid: Iterable[str]) -> str | None:
    """The valid option closest to ``name`` (a typo's likely meaning), or None."""
    matches = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return matches[0] if matches else None


def reject_unknown(
    given: Iterable[str],
    valid: Collection[str],
    where: str,
    *,
    keywords: bool = False,
    passed_on: Collection[str] = (),
    others: str = "",
) -> None:
    """Raise ValueError for the first name in ``given`` that is neither in ``valid`` nor in ``passed_on``.

    ``valid`` are asynclock's options for this backend, the ones its docs
    list (``COMMON_OPTIONS`` are added, and ``on_event`` and ``require`` for
    ``keywords``: a URL carries neither a callback nor a set); ``passed_on`` are the names a client library
    takes, handed on as they are, and ``others`` says what they are in words
    (e.g. ``"and what redis-py's Redis.from_url takes, such as socket_timeout"``).
    The message names the option, the closest name either way, then
    asynclock's options and ``others``, never the library's whole list::

        unknown option 'tll' for redis://: did you mean 'ttl'? (valid: connect_timeout, prefix,
        replica_timeout, replicas, ttl; and what redis-py's Redis.from_url takes, such as socket_timeout)
    """
    listed = set(valid) | COMMON_OPTIONS | ({"on_event", "require"} if keywords else set())
    for name in given:
        if name in listed or name in passed_on:
            continue
        hint = suggest(name, {*listed, *passed_on})
        did_you_mean = f": did you mean {hint!r}?" if hint else ""
        tail = f"; {others}" if others else ""
        valid_ones = ", ".join(sorted(listed))
        raise ValueError(f"unknown option {name!r} for {where}{did_you_mean} (valid: {valid_ones}{tail})")


def take_query(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """Split ``url`` into the URL without the query parameters ``names``, and those parameters."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {key: value for key, value in query if key in names}
    rest = [(key, value) for key, value in query if key not in names]
    return urlunsplit(parts._replace(query=urlencode(rest))), own


def query_names(url: str) -> list[str]:
    """The names of ``url``'s query parameters, in order."""
    return [key for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)]


def seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A positive finite number of seconds from a keyword (a number) or a URL (text)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"{what} must be a positive finite number of seconds, got {value!r}")
    return number


def whole(value: object, what: str, *, minimum: int = 0) -> int:
    """A whole number from a keyword (an int) or a URL (text), at least ``minimum``."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{what} must be a whole number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a whole number, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


def host_list(hosts: str, url: str, what: str, *, default_port: int | None = None) -> list[tuple[str, int]]:
    """``h1:p1,h2:p2`` (a URL's hosts) as (host, port) pairs; ``[v6]:port`` without its brackets.

    A host without a port gets ``default_port``, or is refused if there is
    none. ValueError ``"<what> as host:port, got …"`` for an empty host or
    a port that is not a number from 1 to 65535, with ``url`` shown masked.
    """
    pairs: list[tuple[str, int]] = []
    for item in hosts.split(","):
        item = item.strip()
        if item.startswith("["):  # an IPv6 address: the colons inside the brackets are not the port's
            name, _, rest = item[1:].partition("]")
            sep, port = rest[:1], rest[1:]
            if rest and sep != ":":
                name = ""
        else:
            name, sep, port = item.rpartition(":")
            if not sep:
                name, port = port, ""
        if not port and default_port is not None and not sep:
            port = str(default_port)
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{what} as host:port, got {item!r} in {mask_url(url)}")
        pairs.append((name, int(port)))
    return pairs


def credentials(userinfo: str) -> dict[str, str]:
    """``username`` and ``password`` of a URL's userinfo (``user:password``), percent-decoded, those given."""
    found: dict[str, str] = {}
    user, _, password = userinfo.partition(":")
    if user:
        found["username"] = unquote(user)
    if password:
        found["password"] = unquote(password)
    return found


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo (and any ``password=`` parameter) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}{colon}{MASK if colon else ''}@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret(key) for key, _ in pairs):
            query = urlencode([(key, MASK if _secret(key) else value) for key, value in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def mask_text(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every non-empty secret in ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> list[str]:
    """The passwords written in ``url`` (userinfo, ``password=``-like parameters), as written and decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found: list[str] = []
    userinfo = parts.netloc.rpartition("@")[0]
    if ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found += [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if _secret(key)]
    return [text for secret in found if secret for text in {secret, unquote(secret)}]


def mask_secrets(text: str, url: str) -> str:
    """``text`` with ``url`` masked and every password of ``url`` replaced by ``***``."""
    longest_first = sorted(url_secrets(url), key=len, reverse=True)
    return mask_text(text.replace(url, mask_url(url)), longest_first)


def _secret(key: str) -> bool:
    key = key.lower()
    return "password" in key or key in {"passwd", "pass", "token", "auth"}
