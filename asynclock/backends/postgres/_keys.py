"""Names to keys: the two-int advisory keys, fence rows and channels of every primitive.

Keys live in the two-int advisory space (``pg_advisory_lock(int4, int4)``,
``objsubid = 2`` in ``pg_locks``), out of the way of the single-bigint keys
other tools use. Each is 64 bits of BLAKE2b over the prefix and the name,
personalised per use, so a plain lock, a read-write lock and a semaphore of
one name never share a key. These functions are stable across versions:
clients of different versions of asynclock must meet on the same keys.
"""

from __future__ import annotations

import functools
import hashlib
import struct

from ...abc import LockRef

__all__ = [
    "APP_TAG",
    "EPOCH_ROW",
    "PERMITS_MARK",
    "SEED_KEY",
    "Key",
    "advisory_key",
    "app_name",
    "channel",
    "election_channel",
    "election_key",
    "fence_row",
    "gate_key",
    "marker_key",
    "name_check",
    "parse_app_name",
    "permits_key",
    "rw_key",
    "session_key",
    "slot_arrays",
    "slot_key",
    "term_key",
]

Key = tuple[int, int]

#: Tag at the start of the application_name of asynclock's connections.
APP_TAG = "asynclock"

#: Fence rows of the read-write lock and the semaphore start with a byte that
#: no UTF-8 text starts with, so they never meet a plain lock's row.
RW_ROW = b"\xffrw\0"
SEM_ROW = b"\xffsem\0"
ELECT_ROW = b"\xffelect\0"
#: The fence table's epoch row: there from the table's creation until a crash
#: empties the (unlogged) table (see ``_tokens``).
EPOCH_ROW = b"\xffepoch\0"
#: A semaphore's fence row records the permits of its holders in ``k1`` when
#: ``k2`` is this mark.
PERMITS_MARK = -1


def _digest_key(person: bytes, data: bytes) -> Key:
    high, low = struct.unpack(">ii", hashlib.blake2b(data, digest_size=8, person=person).digest())
    return high, low


@functools.lru_cache(maxsize=4096)
def advisory_key(prefix: str, name: str) -> Key:
    """The two-int advisory lock key of ``name`` under ``prefix``."""
    return _digest_key(b"asynclock-key", f"{prefix}\0{name}".encode())


@functools.lru_cache(maxsize=1024)
def rw_key(prefix: str, name: str) -> Key:
    """The advisory key of the read-write lock ``name`` (unrelated to the plain lock's)."""
    return _digest_key(b"asynclock-rw", f"{prefix}\0{name}".encode())


@functools.lru_cache(maxsize=1024)
def election_key(prefix: str, name: str) -> Key:
    """The advisory key the candidates of the election ``name`` take (unrelated to the plain lock's)."""
    return _digest_key(b"asynclock-elect", f"{prefix}\0{name}".encode())


def term_key(key: Key, token: int) -> Key:
    """The advisory key the leader of the election ``key`` holds for its term of ``token``:
    the leader's row is live while somebody holds it."""
    return _digest_key(b"asynclock-term", struct.pack(">iiq", *key, token))


def election_channel(key: Key) -> str:
    """The LISTEN/NOTIFY channel of the election ``key`` (hex digits: safe to inline, never a client's)."""
    return f"{APP_TAG}_elect_{key[0] & 0xFFFFFFFF:08x}{key[1] & 0xFFFFFFFF:08x}"


@functools.lru_cache(maxsize=1024)
def gate_key(prefix: str, name: str) -> Key:
    """The advisory key the waiters of the semaphore ``name`` queue on."""
    return _digest_key(b"asynclock-gate", f"{prefix}\0{name}".encode())


def slot_key(prefix: str, name: str, slot: int) -> Key:
    """The advisory key of permit ``slot`` (0 to permits-1) of the semaphore ``name``."""
    return _digest_key(b"asynclock-slot", f"{prefix}\0{name}".encode() + struct.pack(">I", slot))


def permits_key(prefix: str, name: str, permits: int) -> Key:
    """The advisory key every hold of the semaphore ``name`` takes shared while it holds with ``permits``.

    A client that asks for another number finds out whether anybody still
    holds with the recorded one by trying this key exclusively.
    """
    return _digest_key(b"asynclock-perm", f"{prefix}\0{name}".encode() + struct.pack(">I", permits))


@functools.lru_cache(maxsize=256)
def slot_arrays(prefix: str, name: str, permits: int) -> tuple[list[int], list[int]]:
    """The slot keys of a semaphore as two int4 arrays (high halves, low halves)."""
    keys = [slot_key(prefix, name, slot) for slot in range(permits)]
    return [k[0] for k in keys], [k[1] for k in keys]


@functools.lru_cache(maxsize=4096)
def marker_key(key: Key) -> Key:
    """The queue marker of the advisory key ``key``: held (shared) by every listening
    session whose client has a waiter queued for ``key``, so that taking it
    exclusively for an instant tells whether anybody waits."""
    return _digest_key(b"asynclock-queue", struct.pack(">ii", *key))


def session_key(backend: str, incarnation: int) -> Key:
    """The key a listening session holds for its life: its queued waiters are alive while it is taken."""
    return _digest_key(b"asynclock-sess", f"{backend}\0{incarnation}".encode())


#: Serialises the reseeding of the token sequence after a crash (see ``_tokens``).
SEED_KEY: Key = _digest_key(b"asynclock-seed", b"")


def channel(backend: str) -> str:
    """The LISTEN/NOTIFY channel of one backend (client): hex digits only, safe to inline."""
    return f"{APP_TAG}_{backend}"


@functools.lru_cache(maxsize=4096)
def name_check(prefix: str, name: str) -> str:
    """8 hex digits from a digest independent of the key: tells colliding names apart."""
    return hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=4, person=b"asynclock-chk").hexdigest()


def app_name(client: str, backend: str) -> str:
    """The application_name of a client's connections: the client's id (what ``Locks.client_id``
    says) and the backend's, whose channel answers questions about its holds."""
    return f"{APP_TAG} {client} {backend}"


def parse_app_name(app: str | None) -> tuple[str, str] | None:
    """(client id, backend id) from an application_name made by :func:`app_name`, else None."""
    parts = (app or "").split(" ")
    if len(parts) != 3 or parts[0] != APP_TAG or not parts[2].isalnum():
        return None
    return parts[1], parts[2]


def fence_row(ref: LockRef) -> bytes:
    """The fence table row (token counter) of ``ref``: read and write sides share one; an
    election has its own, never the plain lock's of its name."""
    if ref.kind in ("read", "write"):
        return RW_ROW + ref.name.encode()
    if ref.kind == "semaphore":
        return SEM_ROW + ref.name.encode()
    if ref.kind == "election":
        return ELECT_ROW + ref.name.encode()
    return ref.name.encode()
