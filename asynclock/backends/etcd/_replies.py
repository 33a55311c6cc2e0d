"""The etcd v3 answers the lock reads, decoded from protobuf's wire format by hand.

The requests and the wire format itself are described in :mod:`._wire`.
Only the fields the lock uses are kept; unknown fields are skipped, so a
newer etcd that adds fields is still understood.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ._wire import LEN, VARINT

__all__ = [
    "DELETE",
    "Created",
    "Event",
    "Header",
    "KeyValue",
    "LeaseResult",
    "RangeResult",
    "TxnResult",
    "WatchResult",
    "deleted_count",
    "parse_delete",
    "parse_token",
]


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
    for number, start, stop in _spans(data, 0, len(data)):
        yield number, (data[start:stop] if stop >= 0 else _varint_at(data, start))


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
    """``mvccpb.KeyValue`` (key 1, create_revision 2, mod_revision 3, version 4, value 5, lease 6);
    a lock's keys are empty, an election candidate's holds its identity."""

    key: bytes
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0
    value: bytes = b""

    @classmethod
    def parse(cls, data: bytes) -> KeyValue:
        key = value = b""
        ints = [0, 0, 0, 0]
        for number, item in _fields(data):
            if isinstance(item, bytes):
                if number == 1:
                    key = item
                elif number == 5:
                    value = item
            elif number in (2, 3, 4, 6):
                ints[(2, 3, 4, 6).index(number)] = _signed(item)
        return cls(key, ints[0], ints[1], ints[2], ints[3], value)


@dataclass(frozen=True, slots=True)
class RangeResult:
    """``RangeResponse`` (header 1, kvs 2, more 3, count 4)."""

    header: Header
    kvs: list[KeyValue] = field(default_factory=list)
    count: int = 0

    @classmethod
    def parse(cls, data: bytes, *, header_too: bool = True) -> RangeResult:
        """(Inside a transaction its header is not read: the transaction's own is the one that counts.)"""
        header = _NO_HEADER
        kvs: list[KeyValue] = []
        count = 0
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                if header_too:
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
                # one ResponseOp: one of range 1, put 2, delete 3, txn 4 (other fields are a newer etcd's)
                response = (0, RangeResult(_NO_HEADER))
                for kind, body in _fields(value):
                    if not isinstance(body, bytes):
                        continue
                    if kind == 1:
                        response = (1, RangeResult.parse(body, header_too=False))
                    elif kind == 3:
                        response = (3, parse_delete(body))
                    elif kind in (2, 4):
                        response = (kind, RangeResult(_NO_HEADER))
                responses.append(response)
        return cls(header, succeeded, responses)

    def range(self, index: int) -> RangeResult:
        """The result of the range op at ``index`` of the branch that ran."""
        kind, result = self.responses[index]
        if kind != 1:
            raise ValueError(f"response {index} of the transaction is no range")
        return result


@dataclass(frozen=True, slots=True)
class Created:
    """The answer to a contender's creating transaction, read for what the queue uses of it:
    whether the put ran (``succeeded``), the revision etcd answered at (the new key's create
    revision when it did), and, for each response of the branch that ran, the create
    revision of the first key a range read (0: it found none; None: the response is no
    range). Nothing else is decoded: this is read on every acquisition."""

    succeeded: bool
    revision: int
    firsts: tuple[int | None, ...]

    @classmethod
    def parse(cls, data: bytes) -> Created:
        succeeded = False
        revision = 0
        firsts: list[int | None] = []
        # TxnResponse: header 1, succeeded 2, responses 3 (each a ResponseOp: one of
        # response_range 1, response_put 2, response_delete_range 3, response_txn 4)
        for number, start, stop in _spans(data, 0, len(data)):
            if stop < 0:
                if number == 2:
                    succeeded = _varint_at(data, start) != 0
            elif number == 1:
                revision = _int_field(data, start, stop, 3)  # ResponseHeader.revision
            elif number == 3:
                first: int | None = None
                for kind, body, body_end in _spans(data, start, stop):
                    if kind == 1 and body_end >= 0:
                        # RangeResponse.kvs (2), the first KeyValue's create_revision (2)
                        kv, kv_end = _find(data, body, body_end, 2, first=True)
                        first = _int_field(data, kv, kv_end, 2) if kv_end >= 0 else 0
                    elif 2 <= kind <= 4:
                        first = None
                firsts.append(first)
        return cls(succeeded, revision, tuple(firsts))

    def first(self, index: int) -> int:
        """The create revision of the first key the range op at ``index`` of the branch
        that ran read (0: none)."""
        found = self.firsts[index]
        if found is None:
            raise ValueError(f"response {index} of the transaction is no range")
        return found


def _spans(data: bytes, offset: int, end: int) -> list[tuple[int, int, int]]:
    """(field number, start, stop) of each field of the message ``data[offset:end]``: a
    length-delimited value is ``data[start:stop]``; a varint starts at ``start`` (stop -1;
    :func:`_varint_at` reads it). Fixed-size fields are left out. Nothing is decoded or
    copied: the hot answers' ids and leases are ten-byte varints nobody reads."""
    spans: list[tuple[int, int, int]] = []
    while offset < end:
        tag = data[offset]
        if tag < 0x80:
            offset += 1
        else:
            tag, offset = _read_varint(data, offset)
        kind = tag & 7
        if kind == VARINT:
            if offset < end and data[offset] < 0x80:
                spans.append((tag >> 3, offset, -1))
                offset += 1
            else:
                found = _VARINT_END.match(data, offset, end)
                if found is None:
                    raise ValueError("truncated varint")
                spans.append((tag >> 3, offset, -1))
                offset = found.end()
        elif kind == LEN:
            if offset < end and data[offset] < 0x80:
                size = data[offset]
                offset += 1
            else:
                size, offset = _read_varint(data, offset)
            if offset + size > end:
                raise ValueError("truncated field")
            spans.append((tag >> 3, offset, offset + size))
            offset += size
        elif kind == 1:  # 64-bit: none in these messages; skip
            offset += 8
        elif kind == 5:  # 32-bit
            offset += 4
        else:
            raise ValueError(f"unsupported wire type {kind}")
    if offset > end:
        raise ValueError("truncated field")
    return spans


def _find(data: bytes, offset: int, end: int, wanted: int, *, first: bool = False) -> tuple[int, int]:
    """Where field ``wanted`` of the message ``data[offset:end]`` is: (start, stop) of a
    length-delimited value, (start, -1) of a varint, (-1, -1) when absent. The last one,
    as protobuf reads a scalar, or with ``first`` the first item of a repeated field."""
    found = (-1, -1)
    for number, start, stop in _spans(data, offset, end):
        if number == wanted:
            found = (start, stop)
            if first and stop >= 0:
                break
    return found


#: the bytes of one varint: up to nine with the continuation bit, then one without
_VARINT_END = re.compile(rb"[\x80-\xff]{0,9}[\x00-\x7f]")


def _varint_at(data: bytes, offset: int) -> int:
    value = data[offset]
    return value if value < 0x80 else _read_varint(data, offset)[0]


def _int_field(data: bytes, start: int, stop: int, wanted: int) -> int:
    """The int64 field ``wanted`` of the message ``data[start:stop]`` (0 when absent)."""
    at, end = _find(data, start, stop, wanted)
    return _signed(_varint_at(data, at)) if at >= 0 and end < 0 else 0


def deleted_count(data: bytes) -> int:
    """``DeleteRangeResponse.deleted`` (field 2): how many keys went."""
    return _int_field(data, 0, len(data), 2)


def parse_delete(data: bytes) -> RangeResult:
    """``DeleteRangeResponse`` (header 1, deleted 2) as a RangeResult whose count is ``deleted``
    (its header is not read: nothing uses it)."""
    deleted = 0
    for number, value in _fields(data):
        if number == 2 and isinstance(value, int):
            deleted = _signed(value)
    return RangeResult(_NO_HEADER, [], deleted)


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
