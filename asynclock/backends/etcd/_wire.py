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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "Compare",
    "Event",
    "Header",
    "KeyValue",
    "Op",
    "RangeResult",
    "TxnResult",
    "WatchResult",
    "prefix_end",
]

_VARINT, _LEN = 0, 2
_MASK64 = (1 << 64) - 1

# -- encoding ---------------------------------------------------------------------------


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
    return _varint(number << 3 | _VARINT) + _varint(value)


def _bytes(number: int, value: bytes) -> bytes:
    """A bytes/string/message field; left out when empty."""
    if not value:
        return b""
    return _varint(number << 3 | _LEN) + _varint(len(value)) + value


def _message(number: int, value: bytes) -> bytes:
    """An embedded message field, written even when empty (its presence is the meaning)."""
    return _varint(number << 3 | _LEN) + _varint(len(value)) + value


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
        union = _varint(number << 3 | _VARINT) + _varint(self.value)
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


# -- decoding ---------------------------------------------------------------------------


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise ValueError("truncated varint")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, offset
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _signed(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) for each field: an int for varints, bytes for length-delimited."""
    offset = 0
    end = len(data)
    while offset < end:
        tag, offset = _read_varint(data, offset)
        number, kind = tag >> 3, tag & 7
        if kind == _VARINT:
            value, offset = _read_varint(data, offset)
            yield number, value
        elif kind == _LEN:
            size, offset = _read_varint(data, offset)
            if offset + size > end:
                raise ValueError("truncated field")
            yield number, data[offset : offset + size]
            offset += size
        elif kind == 1:  # 64-bit: none in these messages; skip
            offset += 8
        elif kind == 5:  # 32-bit
            offset += 4
        else:
            raise ValueError(f"unsupported wire type {kind}")


@dataclass(frozen=True, slots=True)
class Header:
    """``ResponseHeader``: which member answered, at which revision and raft term."""

    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0

    @classmethod
    def parse(cls, data: bytes) -> Header:
        values = [0, 0, 0, 0]
        for number, value in _fields(data):
            if 1 <= number <= 4 and isinstance(value, int):
                values[number - 1] = value
        return cls(values[0], values[1], _signed(values[2]), values[3])


_NO_HEADER = Header()


@dataclass(frozen=True, slots=True)
class KeyValue:
    """``mvccpb.KeyValue`` (its value is not used by the lock, and not kept)."""

    key: bytes
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0

    @classmethod
    def parse(cls, data: bytes) -> KeyValue:
        key = b""
        ints = [0, 0, 0, 0]
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                key = value
            elif isinstance(value, int) and number in (2, 3, 4, 6):
                ints[(2, 3, 4, 6).index(number)] = _signed(value)
        return cls(key, ints[0], ints[1], ints[2], ints[3])


@dataclass(frozen=True, slots=True)
class RangeResult:
    """``RangeResponse`` (header 1, kvs 2, more 3, count 4)."""

    header: Header
    kvs: list[KeyValue] = field(default_factory=list)
    count: int = 0

    @classmethod
    def parse(cls, data: bytes) -> RangeResult:
        header = _NO_HEADER
        kvs: list[KeyValue] = []
        count = 0
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                header = Header.parse(value)
            elif number == 2 and isinstance(value, bytes):
                kvs.append(KeyValue.parse(value))
            elif number == 4 and isinstance(value, int):
                count = _signed(value)
        return cls(header, kvs, count)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``TxnResponse`` (header 1, succeeded 2, responses 3). Each response is
    (kind, result): kind 1 a range (a RangeResult), 2 a put, 3 a delete (the
    number of keys deleted, as a RangeResult's ``count``)."""

    header: Header
    succeeded: bool
    responses: list[tuple[int, RangeResult]]

    @classmethod
    def parse(cls, data: bytes) -> TxnResult:
        header = _NO_HEADER
        succeeded = False
        responses: list[tuple[int, RangeResult]] = []
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                header = Header.parse(value)
            elif number == 2 and isinstance(value, int):
                succeeded = bool(value)
            elif number == 3 and isinstance(value, bytes):
                for kind, body in _fields(value):
                    if not isinstance(body, bytes):
                        continue
                    if kind == 1:
                        responses.append((1, RangeResult.parse(body)))
                    elif kind == 3:
                        responses.append((3, _deleted(body)))
                    else:
                        responses.append((kind, RangeResult(_header_of(body))))
        return cls(header, succeeded, responses)

    def range(self, index: int) -> RangeResult:
        """The result of the range op at ``index`` of the branch that ran."""
        kind, result = self.responses[index]
        if kind != 1:
            raise ValueError(f"response {index} of the transaction is no range")
        return result


def _header_of(data: bytes) -> Header:
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            return Header.parse(value)
    return _NO_HEADER


def _deleted(data: bytes) -> RangeResult:
    """``DeleteRangeResponse`` (header 1, deleted 2) as a RangeResult whose count is ``deleted``."""
    header = _NO_HEADER
    deleted = 0
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            header = Header.parse(value)
        elif number == 2 and isinstance(value, int):
            deleted = _signed(value)
    return RangeResult(header, [], deleted)


def parse_delete(data: bytes) -> RangeResult:
    """``DeleteRangeResponse``: ``count`` is the number of keys deleted."""
    return _deleted(data)


def parse_header_only(data: bytes) -> Header:
    """The header of any response (``PutResponse``, ``LeaseRevokeResponse``, …)."""
    return _header_of(data)


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """``LeaseGrantResponse`` / ``LeaseKeepAliveResponse`` / ``LeaseTimeToLiveResponse``
    (header 1, ID 2, TTL 3; a grant's error 4). A TTL of 0 or less: no such lease."""

    header: Header
    lease_id: int
    ttl: int
    error: str = ""

    @classmethod
    def parse(cls, data: bytes) -> LeaseResult:
        header = _NO_HEADER
        lease_id = ttl = 0
        error = ""
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                header = Header.parse(value)
            elif number == 2 and isinstance(value, int):
                lease_id = _signed(value)
            elif number == 3 and isinstance(value, int):
                ttl = _signed(value)
            elif number == 4 and isinstance(value, bytes):
                error = value.decode(errors="replace")
        return cls(header, lease_id, ttl, error)


PUT, DELETE = 0, 1


@dataclass(frozen=True, slots=True)
class Event:
    """``mvccpb.Event`` (type 1: 0 put, 1 delete; kv 2)."""

    type: int
    kv: KeyValue

    @classmethod
    def parse(cls, data: bytes) -> Event:
        kind = PUT
        kv = KeyValue(b"")
        for number, value in _fields(data):
            if number == 1 and isinstance(value, int):
                kind = value
            elif number == 2 and isinstance(value, bytes):
                kv = KeyValue.parse(value)
        return cls(kind, kv)


@dataclass(frozen=True, slots=True)
class WatchResult:
    """``WatchResponse`` (header 1, watch_id 2, created 3, canceled 4,
    compact_revision 5, cancel_reason 6, events 11)."""

    header: Header
    watch_id: int
    created: bool
    canceled: bool
    compact_revision: int
    cancel_reason: str
    events: list[Event]

    @classmethod
    def parse(cls, data: bytes) -> WatchResult:
        header = _NO_HEADER
        watch_id = compact = 0
        created = canceled = False
        reason = ""
        events: list[Event] = []
        for number, value in _fields(data):
            if isinstance(value, bytes):
                if number == 1:
                    header = Header.parse(value)
                elif number == 6:
                    reason = value.decode(errors="replace")
                elif number == 11:
                    events.append(Event.parse(value))
            elif number == 2:
                watch_id = _signed(value)
            elif number == 3:
                created = bool(value)
            elif number == 4:
                canceled = bool(value)
            elif number == 5:
                compact = _signed(value)
        return cls(header, watch_id, created, canceled, compact, reason, events)


def parse_token(data: bytes) -> str:
    """The token of an ``AuthenticateResponse`` (header 1, token 2)."""
    for number, value in _fields(data):
        if number == 2 and isinstance(value, bytes):
            return value.decode()
    return ""
