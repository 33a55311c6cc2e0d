"""Names to ``GET_LOCK`` keys: the plain lock's readable key, and the hashed keys of the other primitives.

A plain (or fair) lock's key is ``<prefix>:<name>`` as it is, so that any
other MySQL client finds it: ``SELECT GET_LOCK('asynclock:orders:42', 10)``
in the ``mysql`` client excludes an asynclock holder of ``orders:42`` and
the other way round. That needs a key the server takes as it is:

* at most 64 characters (MySQL refuses a longer name; MariaDB allows 192),
* no character outside the Basic Multilingual Plane (MySQL keeps lock names
  in utf8mb3) and no control character,
* and a name that does not start with ``#`` (the hashed keys' mark).

Any other name gets a hashed key, ``<prefix, cut at 24>:#l<28 hex digits>``
(112 bits of BLAKE2b over the prefix and the name): still a valid
``GET_LOCK`` name, and what ``info().key`` says, so a foreign client can use
that string. The other primitives always have keys of their own that never
meet a plain lock's: an election ``<prefix>:#e:<name>`` (hashed to
``…:#e<hex>`` when longer than 64), its leader's term key ``…:#t…``, a
semaphore's slots ``<base>#<i>`` (slot ``i``, from 0) on the semaphore's base
``…:#s<hex>``. These functions are stable across versions: clients of
different versions must meet on the same keys.

Letter case: MariaDB compares lock names exactly, MySQL in lower case, so on
MySQL two names that differ only in case share one lock (more exclusion,
never less).
"""

from __future__ import annotations

import functools
import hashlib

__all__ = [
    "MAX_KEY",
    "election_key",
    "lock_key",
    "marker",
    "semaphore_key",
    "slot_key",
    "slot_keys",
    "term_key",
]

#: The longest ``GET_LOCK`` name MySQL takes (and the longest key made here).
MAX_KEY = 64
#: How much of the prefix a hashed key keeps (the digest covers all of it).
_PREFIX_KEPT = 24


def _plain(text: str) -> bool:
    """Whether ``text`` can be a lock name as it is: BMP characters, no control characters."""
    return all(" " <= ch <= "\ufffd" and not ("\ud800" <= ch <= "\udfff") and ch != "\x7f" for ch in text)


def _hashed(prefix: str, tag: str, name: str) -> str:
    digest = hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=14, person=b"asynclock-my-" + tag.encode())
    return f"{prefix[:_PREFIX_KEPT]}:#{tag}{digest.hexdigest()}"


@functools.lru_cache(maxsize=4096)
def lock_key(prefix: str, name: str) -> str:
    """The ``GET_LOCK`` key of the plain (and fair) lock ``name``: ``<prefix>:<name>`` when the
    server takes that as it is, else the hashed form (see the module's docs)."""
    key = f"{prefix}:{name}"
    if len(key) <= MAX_KEY and not name.startswith("#") and _plain(key):
        return key
    return _hashed(prefix, "l", name)


@functools.lru_cache(maxsize=1024)
def election_key(prefix: str, name: str) -> str:
    """The key the candidates of the election ``name`` take (never a plain lock's)."""
    key = f"{prefix}:#e:{name}"
    if len(key) <= MAX_KEY and _plain(key):
        return key
    return _hashed(prefix, "e", name)


@functools.lru_cache(maxsize=1024)
def term_key(prefix: str, name: str) -> str:
    """The key the leader of the election ``name`` holds for its term, and its observers wait on."""
    return _hashed(prefix, "t", name)


@functools.lru_cache(maxsize=1024)
def semaphore_key(prefix: str, name: str) -> str:
    """The base of the semaphore ``name``'s slot keys: its token counter's row, and what ``info().key`` names."""
    return _hashed(prefix, "s", name)


def slot_key(prefix: str, name: str, slot: int) -> str:
    """The key of permit ``slot`` (0 to permits-1) of the semaphore ``name``."""
    return f"{semaphore_key(prefix, name)}#{slot}"


@functools.lru_cache(maxsize=256)
def slot_keys(prefix: str, name: str, permits: int) -> tuple[str, ...]:
    """The slot keys of a semaphore of ``permits`` permits, slot 0 first."""
    return tuple(slot_key(prefix, name, slot) for slot in range(permits))


@functools.lru_cache(maxsize=4096)
def marker(key: str) -> str:
    """16 hex digits that mark the waiting statements of ``key`` (a lock's, an election's, a
    semaphore's base) in the server's process list, where ``info`` counts them."""
    return hashlib.blake2b(key.encode(), digest_size=8, person=b"asynclock-my-w").hexdigest()
