"""Where things live on the ZooKeeper server, and what a ``zk://`` URL says.

Paths: the plain (and fair) lock ``name`` is the znode ``<chroot>/<prefix>/<name>``;
a read-write lock lives under ``<prefix>/%rw/<name>``, a semaphore under
``<prefix>/%semaphore/<name>`` and an election under
``<prefix>/%election/<name>`` (Curator's layouts, so Curator's recipes
share them: a LeaderLatch on that path takes part in the election). Both
prefix and name are escaped by :func:`escape_name`, so every distinct name
is a distinct valid znode.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

from ..._options import host_list, mask_url
from ...abc import LockRef

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TTL",
    "LATCH_BASE",
    "OPTIONS",
    "Layout",
    "credentials",
    "escape_name",
    "lease_time_of",
    "max_ttl",
    "parse_url",
    "permits_data",
    "permits_of",
    "ttl_refused",
]

#: Default ZooKeeper client port.
DEFAULT_PORT = 2181
#: Our contender names: ``_c_<guid>`` (Curator's protected mode), a base, and the server's sequence number.
PROTECTED = "_c_"
#: The base of a lock's node: ``_c_<guid>-lock-<seq>``.
LOCK_BASE = "-lock-"
#: Curator's read-write lock: node names ``_c_<guid>-__READ__<seq>`` / ``…-__WRIT__<seq>``.
READ = "__READ__"
WRITE = "__WRIT__"
#: Curator's InterProcessSemaphoreV2: ``<path>/locks`` (a mutex) and ``<path>/leases/_c_<guid>-lease-<seq>``.
SEM_LOCKS = "locks"
SEM_LEASES = "leases"
LEASE_BASE = "-lease-"
#: Curator's LeaderLatch: a candidate is ``<path>/_c_<guid>-latch-<seq>`` holding its participant id (UTF-8).
LATCH_BASE = "-latch-"
#: Directories under the prefix for the read-write locks and the semaphores. A
#: ``%`` followed by letters that are no hex digits is never made by
#: :func:`escape_name`, so no lock name can be one of them.
RW_DIR = "%rw"
SEM_DIR = "%semaphore"
ELECTION_DIR = "%election"
RESERVED = (RW_DIR, SEM_DIR, ELECTION_DIR)

#: Options of a ``zk://`` URL (``ttl``, ``prefix`` and ``connect_timeout`` are
#: read by ``connect()``, the rest here).
OPTIONS = frozenset({"ttl", "prefix", "connect_timeout", "session_timeout"})
#: Default ttl and session timeout, in seconds.
DEFAULT_TTL = 30.0
#: What a semaphore's lease node holds: the permits its client asked for.
#: Curator's InterProcessSemaphoreV2 ignores lease data (its own nodes hold
#: the client's address), so the two still share the permits.
_PERMITS_DATA = b"asynclock permits="


def max_ttl(session_timeout: float) -> float:
    """The ttl a ZooKeeper lock must stay under, for a session timeout (seconds).

    The lease is the session: the watchdog renews it every ttl/3, which must
    come well within the lease time (three quarters of it), so about twice
    the session timeout.
    """
    return 2.25 * lease_time_of(session_timeout)


def lease_time_of(session_timeout: float) -> float:
    """The lease a session of ``session_timeout`` gives: 10 % (+5 ms) less."""
    return session_timeout - (session_timeout * 0.1 + 0.005)


def ttl_refused(ttl: float, session_timeout: float) -> str:
    """Why a lock's ``ttl`` is refused for a session of ``session_timeout``."""
    return (
        f"a ZooKeeper lock's ttl ({ttl:g} s) must stay under {max_ttl(session_timeout):.3g} s with a session"
        f" timeout of {session_timeout:g} s: the lease is the session, and the watchdog renews it every ttl/3;"
        " leave the ttl out (it follows the session), pass a smaller ttl or a longer session_timeout"
    )


def permits_data(permits: int) -> bytes:
    """What a semaphore's lease node of asynclock holds."""
    return _PERMITS_DATA + str(permits).encode()


def permits_of(data: bytes | None) -> int | None:
    """The permits a lease node of asynclock records, or None (Curator's, or none)."""
    if not data or not data.startswith(_PERMITS_DATA):
        return None
    try:
        return int(data[len(_PERMITS_DATA) :])
    except ValueError:
        return None


def _unsafe(char: str) -> bool:
    code = ord(char)
    return (
        char in "%/"
        or code < 0x20
        or 0x7F <= code <= 0x9F
        # ZooKeeper rejects these UTF-16 units, which includes every surrogate
        # (so every character outside the BMP) and the private use area
        or 0xD800 <= code <= 0xF8FF
        or code >= 0xFFF0
    )


def escape_name(name: str) -> str:
    """A valid znode name for ``name``, distinct for distinct names.

    Percent-encodes (the UTF-8 bytes of) ``%``, ``/``, control characters and
    every character ZooKeeper rejects, and the names ``.`` and ``..``.
    Percent-decoding gives the name back, so two names never share a node.
    """
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return "".join("".join(f"%{byte:02X}" for byte in c.encode()) if _unsafe(c) else c for c in name)


class Layout:
    """The paths of one client's locks: ``<chroot>/<prefix>`` and what is under it."""

    __slots__ = ("base", "chroot")

    def __init__(self, chroot: str, prefix: str) -> None:
        self.chroot = chroot
        #: the znode every lock of this client's prefix lives under
        self.base = f"{chroot}/{escape_name(prefix)}"

    def key(self, ref: LockRef) -> str:
        """The lock's znode: the plain and the fair lock share one (the recipe is FIFO)."""
        if ref.kind in ("lock", "fair"):
            return f"{self.base}/{escape_name(ref.name)}"
        family = {"read": RW_DIR, "write": RW_DIR, "semaphore": SEM_DIR, "election": ELECTION_DIR}[ref.kind]
        return f"{self.base}/{family}/{escape_name(ref.name)}"


def parse_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, str]]:
    """``zk://h1:p1,h2:p2/chroot?opt=v`` → hosts, chroot (``""`` or ``/a/b``), options."""
    parts = urlsplit(url)
    if parts.scheme != "zk":
        raise ValueError(f"not a zk:// URL: {mask_url(url)!r}")
    url = mask_url(url)  # (for the messages below)
    hosts = host_list(
        parts.netloc.rpartition("@")[2], url, "a ZooKeeper URL names its servers", default_port=DEFAULT_PORT
    )
    chroot = unquote(parts.path).rstrip("/")
    for segment in chroot.split("/")[1:]:
        if not segment or segment in (".", "..") or any(_unsafe(c) and c != "%" for c in segment):
            raise ValueError(f"bad chroot {chroot!r} in {url!r}")
    return hosts, chroot, dict(parse_qsl(parts.query, keep_blank_values=True))


def credentials(url: str) -> tuple[str, bytes] | None:
    """The ``digest`` credentials of ``zk://user:password@hosts/…`` as ZooKeeper takes them, or None."""
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return None
    userinfo = netloc.rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    if not user or not colon:
        raise ValueError("ZooKeeper digest credentials go in the URL as zk://user:password@host/…")
    return "digest", f"{unquote(user)}:{unquote(password)}".encode()
