"""``etcd[s]://[user[:password]@]h1:p1,h2:p2[/path]?opt=v``: endpoints, key path and options, before any I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._options import host_list, mask_text, reject_unknown
from ._channel import TlsOptions

__all__ = ["OPTIONS", "Target", "parse_url", "target"]

#: Default etcd client port.
DEFAULT_PORT = 2379
#: Options an ``etcd://`` URL (or ``connect``) may carry, besides asynclock's own.
OPTIONS = ("user", "password", "ca_file", "cert_file", "key_file", "server_name")
_TLS_OPTIONS = ("ca_file", "cert_file", "key_file", "server_name")


def parse_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, str], bool]:
    """``etcd[s]://[user[:password]@]h1:p1,h2:p2[/path]?opt=v`` → endpoints, path
    (``""`` or ``/a/b``), options (user and password included), TLS."""
    parts = urlsplit(url)
    if parts.scheme not in ("etcd", "etcds"):
        raise ValueError(f"not an etcd:// or etcds:// URL: {mask_text(url, [parts.password])}")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        options.setdefault("user", unquote(user))
        if colon:
            options.setdefault("password", unquote(password))
    endpoints = host_list(netloc, url, "an etcd URL names its members", default_port=DEFAULT_PORT)
    path = unquote(parts.path).rstrip("/")
    if any(segment in ("", ".", "..") for segment in path.split("/")[1:]):
        raise ValueError(f"bad key path {path!r} in etcd URL")
    return endpoints, path, options, parts.scheme == "etcds"


@dataclass(frozen=True, slots=True)
class Target:
    """What an ``etcd://`` URL and the ``connect`` options say, checked."""

    endpoints: list[tuple[str, int]]
    path: str
    tls: TlsOptions | None
    user: str | None
    password: str | None


def target(url: str, options: dict[str, Any]) -> Target:
    """The URL's endpoints, key path, TLS and credentials, with ``options`` (which win over
    the URL's query); ValueError or TypeError for what is unknown or misplaced."""
    endpoints, path, query, tls = parse_url(url)
    merged: dict[str, Any] = {**query, **options}
    where = f"{url.split('://', 1)[0]}://"
    reject_unknown(query, OPTIONS, where)
    reject_unknown(options, OPTIONS, where, keywords=True)
    for key in _TLS_OPTIONS:
        if key in merged and not tls:
            raise ValueError(f"{key} is a TLS option: use an etcds:// URL")
        if key in merged and not isinstance(merged[key], str):
            raise TypeError(f"{key} must be a str, not {type(merged[key]).__name__}")
    tls_options = TlsOptions(**{key: merged[key] for key in _TLS_OPTIONS if key in merged}) if tls else None
    return Target(endpoints, path, tls_options, merged.get("user"), merged.get("password"))
