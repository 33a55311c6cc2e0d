"""The etcd v3 messages the lock needs, in protobuf's wire format, by hand.

etcd's API is gRPC over its ``etcdserverpb`` protobufs. The lock uses a
dozen of those messages and few of their fields, so they are written and
read here directly (field numbers from etcd's ``rpc.proto``, ``kv.proto``
and ``auth.proto``): no generated code to ship or regenerate, no protobuf
runtime, and the hot requests cost a few byte concatenations. gRPC carries
them as raw bytes (see ``_client``).

Wire format: a message is a sequence of fields, each a varint *tag*
(``field_number << 3 | wire_type``) and a value: wire type 0 a varint
(``int64`` is two's complement in 64 bits, ``bool`` is 0/1), wire type 2 a
varint length and that many bytes (``bytes``, ``string``, an embedded
message, a packed repeated scalar). proto3 leaves a field at its default
value (0, empty) out, and a reader takes a missing field as that default.

This module writes requests; :mod:`._replies` reads the answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Compare", "Op", "prefix_end"]

#: Wire types: a varint, and a length-delimited value.
VARINT, LEN = 0, 2
_MASK64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int(number: int, value: int) -> bytes:
    """An int64/enum/bool field; left out at 0, as proto3 does."""
    if not value:
        return b""
    return _varint(number << 3 | VARINT) + _varint(value)


def _bytes(number: int, value: bytes) -> bytes:
    """A bytes/string/message field; left out when empty."""
    if not value:
        return b""
    return _varint(number << 3 | LEN) + _varint(len(value)) + value


def _message(number: int, value: bytes) -> bytes:
    """An embedded message field, written even when empty (its presence is the meaning)."""
    return _varint(number << 3 | LEN) + _varint(len(value)) + value


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key


# RangeRequest sort orders and targets
ASCEND, DESCEND = 1, 2
SORT_KEY, SORT_CREATE, SORT_MOD = 0, 2, 3


def range_request(
    key: bytes,
    range_end: bytes = b"",
    *,
    limit: int = 0,
    sort_order: int = 0,
    sort_target: int = 0,
    keys_only: bool = False,
    count_only: bool = False,
    max_create_revision: int = 0,
    revision: int = 0,
) -> bytes:
    """``RangeRequest`` (key 1, range_end 2, limit 3, revision 4, sort_order 5,
    sort_target 6, keys_only 8, count_only 9, max_create_revision 13)."""
    return b"".join(
        (
            _bytes(1, key),
            _bytes(2, range_end),
            _int(3, limit),
            _int(4, revision),
            _int(5, sort_order),
            _int(6, sort_target),
            _int(8, keys_only),
            _int(9, count_only),
            _int(13, max_create_revision),
        )
    )


def put_request(key: bytes, value: bytes = b"", *, lease: int = 0) -> bytes:
    """``PutRequest`` (key 1, value 2, lease 3)."""
    return _bytes(1, key) + _bytes(2, value) + _int(3, lease)


def delete_request(key: bytes, range_end: bytes = b"") -> bytes:
    """``DeleteRangeRequest`` (key 1, range_end 2)."""
    return _bytes(1, key) + _bytes(2, range_end)


@dataclass(frozen=True, slots=True)
class Op:
    """One ``RequestOp`` of a transaction: kind 1 range, 2 put, 3 delete; ``body`` the request."""

    kind: int
    body: bytes

    @classmethod
    def range(cls, key: bytes, range_end: bytes = b"", **options: int | bool) -> Op:
        return cls(1, range_request(key, range_end, **options))  # type: ignore[arg-type]

    @classmethod
    def put(cls, key: bytes, value: bytes = b"", *, lease: int = 0) -> Op:
        return cls(2, put_request(key, value, lease=lease))

    @classmethod
    def delete(cls, key: bytes, range_end: bytes = b"") -> Op:
        return cls(3, delete_request(key, range_end))

    def encode(self) -> bytes:
        return _message(self.kind, self.body)


# Compare results and targets
EQUAL, GREATER, LESS, NOT_EQUAL = 0, 1, 2, 3
TARGET_VERSION, TARGET_CREATE, TARGET_MOD, TARGET_VALUE, TARGET_LEASE = 0, 1, 2, 3, 4
#: the field of ``Compare.target_union`` that carries the value for each target
_TARGET_FIELD: Final = {TARGET_VERSION: 4, TARGET_CREATE: 5, TARGET_MOD: 6, TARGET_LEASE: 8}


@dataclass(frozen=True, slots=True)
class Compare:
    """A ``Compare`` of a key's version, create or mod revision, or lease with ``value``."""

    key: bytes
    target: int
    result: int
    value: int

    def encode(self) -> bytes:
        number = _TARGET_FIELD[self.target]
        # the oneof member is written even at 0: that is how etcd knows which it is
        union = _varint(number << 3 | VARINT) + _varint(self.value)
        return _int(1, self.result) + _int(2, self.target) + _bytes(3, self.key) + union


def txn_request(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> bytes:
    """``TxnRequest`` (compare 1, success 2, failure 3)."""
    parts = [_message(1, c.encode()) for c in compares]
    parts += [_message(2, op.encode()) for op in success]
    parts += [_message(3, op.encode()) for op in failure]
    return b"".join(parts)


def lease_grant_request(ttl: int, lease_id: int = 0) -> bytes:
    """``LeaseGrantRequest`` (TTL 1, ID 2)."""
    return _int(1, ttl) + _int(2, lease_id)


def lease_id_request(lease_id: int) -> bytes:
    """``LeaseRevokeRequest`` / ``LeaseKeepAliveRequest`` (ID 1)."""
    return _int(1, lease_id)


def lease_ttl_request(lease_id: int) -> bytes:
    """``LeaseTimeToLiveRequest`` (ID 1; keys 2 left false)."""
    return _int(1, lease_id)


# WatchCreateRequest filters
NOPUT, NODELETE = 0, 1


def watch_create_request(
    key: bytes, range_end: bytes = b"", *, start_revision: int = 0, filters: Sequence[int] = (), watch_id: int = 0
) -> bytes:
    """``WatchRequest{create_request}`` (key 1, range_end 2, start_revision 3,
    filters 5 packed, watch_id 7)."""
    packed = b"".join(_varint(f) for f in filters)
    body = b"".join(
        (
            _bytes(1, key),
            _bytes(2, range_end),
            _int(3, start_revision),
            _bytes(5, packed),
            _int(7, watch_id),
        )
    )
    return _message(1, body)


def watch_cancel_request(watch_id: int) -> bytes:
    """``WatchRequest{cancel_request}`` (watch_id 1)."""
    return _message(2, _int(1, watch_id))


def authenticate_request(name: str, password: str) -> bytes:
    """``AuthenticateRequest`` (name 1, password 2)."""
    return _bytes(1, name.encode()) + _bytes(2, password.encode())
