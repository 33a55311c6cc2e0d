"""ZooKeeper's wire format (jute) for the requests the recipe sends all the time, and its errors.

aiozk (0.32) serialises every other request and reply (``aiozk.protocol``).
Errors are asynclock's own: :class:`ZkError` is a ``LockError``,
:class:`ZkConnectionLoss` a ``BackendUnavailable``, :class:`ZkRefused` a
``ConfigurationError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

try:
    from aiozk import exc as zk_exc
    from aiozk import protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ZooKeeper backend needs aiozk: pip install 'asynclock[zookeeper]'") from exc

from ..._errors import BackendUnavailable, ConfigurationError, LockError, plain, shown_as
from .._edge import MapErrors

__all__ = [
    "CONTAINER",
    "CREATOR_ACL",
    "EPHEMERAL",
    "EXISTS_OPCODE",
    "NODE_EXISTS",
    "NO_NODE",
    "OPEN_ACL",
    "SEQUENTIAL",
    "Request",
    "ZStat",
    "ZkConnectionLoss",
    "ZkError",
    "ZkRefused",
    "children_request",
    "create_request",
    "delete_request",
    "exists_request",
    "edge",
    "get_data_request",
]


FRAME_SIZE = struct.Struct("!i")
REPLY_HEADER = struct.Struct("!iqi")
WATCH_XID = -1
PING_XID = -2
AUTH_XID = -4

# ZooKeeper error codes used by the recipe
NO_NODE = -101
NODE_EXISTS = -110
NOT_EMPTY = -111
SESSION_EXPIRED = -112
SESSION_MOVED = -118
#: Refusals no retry fixes: the ACL does not let this client in, or its
#: authentication failed.
NO_AUTH = -102
AUTH_FAILED = -115
_REFUSALS = {NO_AUTH: "the ACL refuses this client", AUTH_FAILED: "authentication failed"}

STATE_EXPIRED = -112

#: Flags of a create request.
EPHEMERAL, SEQUENTIAL, CONTAINER = 1, 2, 4


@shown_as(LockError)
class ZkError(LockError):
    """ZooKeeper answered a request with an error ``code`` (e.g. NoNode, -101)."""

    def __init__(self, code: int, path: str = "") -> None:
        kind = zk_exc.response_error_xref.get(code)
        self.code = code
        self.label = kind.__name__ if kind is not None else f"error {code}"
        super().__init__(f"ZooKeeper: {self.label}" + (f" ({path})" if path else ""))


@shown_as(ConfigurationError)
class ZkRefused(ZkError, ConfigurationError):
    """ZooKeeper refused a request for this client's credentials or the node's ACL (NoAuth, AuthFailed).

    No retry fixes it; the message names the server and the path, never a password.
    """

    def __init__(self, code: int, path: str = "", host: str = "") -> None:
        super().__init__(code, path)
        what = _REFUSALS.get(code, "refused")
        where = f" {path}" if path else ""
        self.args = (
            f"ZooKeeper at {host or '?'} refused{where}: {self.label} ({what}; check the credentials,"
            " zk://user:password@host/chroot, and the ACL of the chroot)",
        )


def error_for(code: int, path: str, host: str) -> ZkError:
    """The exception for an error reply ``code`` to a request on ``path`` from ``host``."""
    return ZkRefused(code, path, host) if code in _REFUSALS else ZkError(code, path)


#: What escapes the session without being asynclock's already: a socket's
#: error, a reply aiozk could not parse. (The session's own ZkConnectionLoss is
#: an OSError too: it is named again with the server.)
CLIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, struct.error, UnicodeDecodeError, zk_exc.ZKError)


def edge(where: Callable[[], str]) -> MapErrors:
    """The backend's edge: what the client library or the socket raises becomes asynclock's error.

    The session answers with asynclock's errors already (:class:`ZkError`,
    :class:`ZkConnectionLoss`, :class:`ZkRefused`), which pass as they are
    when they name ZooKeeper; anything else that escapes it (a socket error,
    a reply aiozk could not parse) is a ``BackendUnavailable`` naming the
    server ``where()`` and saying what happened in words, the original kept
    as ``__cause__``. Made once per backend and entered as ``with edge:``
    around each request.
    """

    def translate(exc: BaseException) -> BaseException:
        if isinstance(exc, LockError) and "ZooKeeper" in str(exc):
            return exc
        return ZkConnectionLoss(f"ZooKeeper at {where()}: {plain(exc)}")

    return MapErrors(translate, CLIENT_ERRORS)


@shown_as(BackendUnavailable)
class ZkConnectionLoss(BackendUnavailable):
    """The connection dropped (or the session expired) before the answer came: outcome unknown."""


# -- the hot path's wire format, by hand ---------------------------------------------
#
# aiozk's generic (de)serialisation costs tens of microseconds per request; a
# lock takes three. The requests the recipe sends all the time (create,
# getChildren, delete, exists) and their replies are (de)serialised here with
# ``struct``, in jute's format: big-endian ints, a string or buffer as its
# length and its bytes, a vector as its length and its items.

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!ii")
_STAT = struct.Struct("!qqqqiiiqiiq")
_OPCODE_CREATE2, _OPCODE_CONTAINER = 15, 19
_OPCODE_DELETE, _OPCODE_EXISTS, _OPCODE_CHILDREN = 2, 3, 8
#: exists: the one request whose watch the server sets even when it answers NoNode (a creation watch)
EXISTS_OPCODE = _OPCODE_EXISTS


def _ustring(value: str) -> bytes:
    data = value.encode()
    return _INT.pack(len(data)) + data


#: one ACL: every permission (31) for world:anyone
OPEN_ACL = _INT.pack(1) + _INT.pack(31) + _ustring("world") + _ustring("anyone")
#: one ACL: every permission for the identities the creating connection
#: authenticated as (ZooKeeper's ``auth`` scheme; refused without credentials)
CREATOR_ACL = _INT.pack(1) + _INT.pack(31) + _ustring("auth") + _ustring("")


class Request:
    """A request whose body is serialised already; ``serialize(xid)`` adds the header."""

    __slots__ = ("body", "opcode")

    def __init__(self, opcode: int, body: bytes) -> None:
        self.opcode = opcode
        self.body = body

    def serialize(self, xid: int) -> bytes:
        return _HEADER.pack(xid, self.opcode) + self.body


def create_request(
    path: str, flags: int, *, container: bool = False, data: bytes = b"", acl: bytes = OPEN_ACL
) -> Request:
    """Create2 (or createContainer) of a node holding ``data``; the reply carries the stat.

    ``acl`` is a serialised ACL vector: :data:`OPEN_ACL` (default) or :data:`CREATOR_ACL`.
    """
    body = _ustring(path) + _INT.pack(len(data)) + data + acl + _INT.pack(flags)
    return Request(_OPCODE_CONTAINER if container else _OPCODE_CREATE2, body)


def children_request(path: str, watch: bool = False) -> Request:
    return Request(_OPCODE_CHILDREN, _ustring(path) + (b"\x01" if watch else b"\x00"))


def delete_request(path: str, version: int = -1) -> Request:
    return Request(_OPCODE_DELETE, _ustring(path) + _INT.pack(version))


def get_data_request(path: str, watch: bool = False) -> Any:
    """getData (aiozk serialises it: rare, and its reply carries the data)."""
    return protocol.GetDataRequest(path=path, watch=watch)


def exists_request(path: str, watch: bool = False) -> Request:
    return Request(_OPCODE_EXISTS, _ustring(path) + (b"\x01" if watch else b"\x00"))


class ZStat(NamedTuple):
    """A znode's stat, with aiozk's field names."""

    created_zxid: int
    last_modified_zxid: int
    created: int
    modified: int
    version: int
    child_version: int
    acl_version: int
    ephemeral_owner: int
    data_length: int
    num_children: int
    last_modified_children: int


class Created(NamedTuple):
    path: str
    stat: ZStat


class Children(NamedTuple):
    children: list[str]


class Exists(NamedTuple):
    stat: ZStat


def _read_string(body: bytes, offset: int) -> tuple[str, int]:
    (size,) = _INT.unpack_from(body, offset)
    offset += _INT.size
    if size < 0:
        return "", offset
    end = offset + size
    if end > len(body):
        raise ValueError("string past the end of the reply")
    return body[offset:end].decode(), end


def _parse_created(body: bytes) -> Created:
    path, offset = _read_string(body, 0)
    return Created(path, ZStat._make(_STAT.unpack_from(body, offset)))


def _parse_children(body: bytes) -> Children:
    (count,) = _INT.unpack_from(body, 0)
    offset = _INT.size
    children = []
    for _ in range(max(count, 0)):
        child, offset = _read_string(body, offset)
        children.append(child)
    return Children(children)


def _parse_exists(body: bytes) -> Exists:
    return Exists(ZStat._make(_STAT.unpack_from(body, 0)))


PARSERS: dict[int, Callable[[bytes], Any]] = {
    _OPCODE_CREATE2: _parse_created,
    _OPCODE_CONTAINER: _parse_created,
    _OPCODE_CHILDREN: _parse_children,
    _OPCODE_EXISTS: _parse_exists,
}
