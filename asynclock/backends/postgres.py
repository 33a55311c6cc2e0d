"""PostgreSQL (``postgresql://``, ``postgres://``, or a given ``asyncpg.Pool``).

A hold is a *session-level advisory lock* on a connection kept for the whole
lease, one connection per hold:

* An acquire first *tries* (``pg_try_advisory_lock``), taking the lock, the
  fencing token and the hold's session settings in one statement, one round
  trip. Only when that fails does it wait, in the server's own lock queue
  (``pg_advisory_lock`` bounded by ``lock_timeout``), so nobody polls;
  ``timeout=0`` is the try alone. The try cannot jump that queue: the server
  hands a released lock to the head waiter inside the release itself, and a
  request that conflicts with a queued one is refused. A waiter the caller
  cancels is cancelled on the server too (asyncpg sends a CancelRequest and
  waits for it to be acknowledged); whatever the cancelled statement got is
  unlocked before the connection goes back to the pool, and a connection that
  cannot be brought back to a known state in time is closed (its session, and
  so its locks, end with it). Connections run with
  ``client_connection_check_interval`` (PostgreSQL 14+; set once per
  connection of asynclock's own pool, per wait on a given pool), so the
  waiter of a client that crashed or closed its connection leaves the queue
  instead of waiting on as a ghost. A wait with no timeout probes the server
  every ttl on another connection, so a server that went silent ends it with
  ``BackendUnavailable``.
* The lease is the connection. Each lease connection runs with
  ``idle_session_timeout`` = ttl (PostgreSQL 14+), so a holder that hangs or is
  cut off loses its session, and its locks, a ttl after its last ping; the
  watchdog pings every ttl/3, and the client's trusted deadline (ping send
  time + ttl - drift) ends before the server could end the session. A
  connection that closes (``pg_terminate_backend``, server restart, network)
  loses its holds at once, through asyncpg's termination listener.
* The fencing token is a per-name counter, UPSERT'ed in the same statement
  that takes the lock, in the table ``<prefix>_fence`` (``table=`` to choose
  another, ``schema.table`` allowed), created when missing. The table is
  UNLOGGED: an increment writes no WAL, so an acquire never waits for a WAL
  flush, whatever ``synchronous_commit`` says. A crash (or a restore, or a
  failover to a standby) empties such a table, and the counters start again
  from the server time in µs, above every token handed out before as long as
  the server's clock has not stepped back by more than the time since then
  (Redis's rule). A new table counts each name from 1: an epoch row, written
  with the table (durably) and gone with its contents, tells the two apart.
  A table an earlier version made stays logged and works the same (``ALTER
  TABLE ... SET UNLOGGED`` spares its flush).
* Names map to keys in the two-int advisory space (``pg_advisory_lock(int4,
  int4)``, ``objsubid = 2`` in ``pg_locks``): 64 bits of BLAKE2b over
  prefix and name. The two-int space keeps clear of the single-bigint keys
  other tools use (migrations, job queues). Two names whose keys collide share
  one lock: that can only add exclusion (a hold of either name keeps the other
  out), never remove it, because a session lock is exclusive per key and each
  hold has its own session. ``info`` tells colliding names apart through a
  second, independent digest of the name carried in the holder's
  ``application_name``.
* Re-entry is counted in the client; the server holds the lock once per hold.

More primitives, on the same connections and the same lock manager:

* The fair lock is the plain lock itself (same key, same token counter):
  PostgreSQL grants advisory locks in queue order already.
* A read-write lock takes its own key (a digest of its own): readers
  ``pg_advisory_lock_shared``, the writer ``pg_advisory_lock``. The server
  queues a new shared request behind a waiting exclusive one, so writers are
  not starved. Reads and writes share one token counter.
* A semaphore of N permits is N advisory keys, slot 0 to N-1, plus a gate
  key. A hold owns one slot on its own connection, so a holder whose session
  ends (crash, ``pg_terminate_backend``, idle timeout) frees its permit at
  once. An acquire tries the slots in one statement while nobody waits (it
  takes the gate shared for that instant). Waiters queue on the gate
  (exclusive, the server's FIFO queue); the head of the queue holds the gate,
  LISTENs on the semaphore's channel, and tries the slots again when a
  release NOTIFYs it, or after at most min(ttl/3, 1 s) when no message came
  (a holder that died sends none). Only the head ever retries, so a release
  wakes one waiter per semaphore, and every permit has its own token from the
  semaphore's counter. Every client of a semaphore must ask for the same
  number of permits: the fence row records the holders' number, each hold
  takes a key of its number shared, and a client that asks for another
  number while that key is taken gets ValueError from its acquire, before it
  waits (see ``_check_permits``).

Connections: with a URL asynclock opens its own pool, ``max_leases`` (default
50) connections for holds and waiters plus one for ``info`` and probes, so
held locks never take connections from the application. With a given pool,
holds and waiters borrow from it, at most ``max_leases`` at a time (default:
half of the pool's ``max_size``) so the application keeps the rest; the pool
is not closed by asynclock. Either way every held *or waiting* lock costs one
server connection (a backend process) for as long as it is held or waited
for; several locks are never multiplexed on one connection, because a
blocking wait occupies its session and the death of a shared session would
take every lock on it. A lease connection of asynclock's own pool, clean
after its release, stays with the backend for half a second (four at most)
before it goes back to the pool, so a lock taken again at once needs no pool
hand-over. Session locks need a real session: do not put a
transaction-pooling PgBouncer between asynclock and PostgreSQL.

Errors: what the server refuses for good (a password, a role or database
that does not exist, permission denied on the fence table or its schema, an
unknown server setting, a TLS certificate) raises ConfigurationError at once,
quoting the server; a server that cannot be reached raises
BackendUnavailable naming the address and why (connection refused, name not
resolved, timed out after the connect timeout). No message names a password.

What it does not survive: advisory locks live in the primary's memory and are
not replicated. After a failover the new primary knows no locks, while a
holder still connected to an old primary that keeps running believes it holds
its lock. Its tokens start from its own clock (the counter table is unlogged,
so it comes up empty there): they keep increasing if the two servers' clocks
agree to within the failover's duration. Use it on one primary (or accept that
a failover is a window where only your own fencing checks help).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import inspect
import logging
import math
import re
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'asynclock[postgres]'") from exc

from .._errors import BackendUnavailable, ConfigurationError, LockError
from .._legacy import LOCK, Shape
from .._legacy import LegacyBackend as Backend
from .._legacy import legacy_unsupported as unsupported
from .._options import DEFAULT_CONNECT_TIMEOUT, mask_text, query_names, reject_unknown, take_query
from .._values import LockInfo
from ..abc import Acquired, BackendHooks, Busy, RenewItem

__all__ = ["PostgresBackend", "advisory_key", "gate_key", "name_check", "rw_key", "slot_key"]

logger = logging.getLogger("asynclock")

#: Connections for holds and waiters when asynclock opens the pool itself.
DEFAULT_MAX_LEASES = 50
#: Bound on short requests (info, probes, setup, cleanup), in seconds.
ADMIN_TIMEOUT = 10.0
#: Longest wait for a lease connection's clean-up before it is closed instead, in seconds.
CLEANUP_TIMEOUT = 1.0
#: Tag at the start of a lease connection's application_name.
APP_TAG = "asynclock"
#: PostgreSQL truncates application_name to this many bytes.
APP_NAME_MAX = 63
#: A statement timeout for asyncpg that never fires first (our own bounds apply).
_NO_COMMAND_TIMEOUT = 1e9
#: client_connection_check_interval of asynclock's connections, in ms: how soon
#: a waiter whose client is gone leaves the server's queue.
CHECK_INTERVAL_MS = 1000
#: How long a released lease connection of asynclock's own pool stays with the
#: backend for the next acquire before it goes back to the pool, in seconds,
#: and how many may.
PARK_TIME = 0.5
PARK_MAX = 4
#: Longest pause between two tries of a semaphore's head waiter that heard no
#: release (a holder that died sends none), in seconds.
RECHECK_MAX = 1.0

Key = tuple[int, int]

#: Everything asyncpg (and the socket under it) raises; translated at the edge.
_CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)

#: asynclock's own options (``ttl``, ``prefix`` and ``connect_timeout`` are read
#: by ``connect()``, ``table`` and ``max_leases`` here).
OWN_OPTIONS = frozenset({"ttl", "prefix", "connect_timeout", "table", "max_leases"})
#: The URL query parameters asyncpg reads itself; it sends every other one to
#: the server as a setting (``?application_name=app&search_path=s``), which the
#: server refuses (ConfigurationError) if it does not know it.
DSN_PARAMETERS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "passfile",
        "dbname",
        "database",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)
#: Pool sizes asynclock chooses itself (``max_leases=`` sizes the pool).
_SIZES = frozenset({"min_size", "max_size", "init_size"})
#: What a server setting's name looks like (``search_path``, ``myapp.tenant``).
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")


@functools.cache
def keyword_options() -> frozenset[str]:
    """The keyword options of a ``postgresql://`` client: asynclock's own and those of
    ``asyncpg.create_pool`` and ``asyncpg.connect`` (from their signatures), less what
    asynclock chooses itself (the DSN, the pool's sizes, the loop)."""
    names = set(OWN_OPTIONS)
    for function in (asyncpg.create_pool, asyncpg.connect):
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
                names.add(parameter.name)
    return frozenset(names - _SIZES - {"dsn", "loop"})


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from ``a`` to ``b``."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def _typo(name: str, valid: frozenset[str]) -> bool:
    """Whether a URL query parameter that is no option of ours or asyncpg's is a typo of one.

    Such a parameter would go to the server as a setting; it is refused here
    when it is no setting's name, or one or two edits away from a valid
    option (one for short names). No PostgreSQL setting is that close to one
    of these names, so real settings pass.
    """
    if not _SETTING_NAME.match(name):
        return True
    reach = 1 if len(name) <= 4 else 2
    return any(_edits(name.lower(), option) <= reach for option in valid)


def _dsn_address(dsn: str) -> str:
    """The servers a DSN names (``host:port``, several with commas), without user or password."""
    try:
        parts = urlsplit(dsn)
        hosts = parts.netloc.rpartition("@")[2]
        if not hosts:
            query = dict(parse_qsl(parts.query))
            hosts = query.get("host", "") + (f":{query['port']}" if "port" in query else "")
    except ValueError:
        return "?"
    return hosts or "localhost"


def _dsn_secrets(dsn: str | None, options: dict[str, Any]) -> list[str]:
    """The passwords a DSN and connect options carry (never to be shown)."""
    found = []
    password = options.get("password")
    if isinstance(password, str):
        found.append(password)
    if dsn:
        with contextlib.suppress(ValueError):
            parts = urlsplit(dsn)
            if parts.password:
                found += [parts.password, unquote(parts.password)]
            found += [value for key, value in parse_qsl(parts.query) if key in ("password", "sslpassword")]
    return [secret for secret in found if secret]


def _pool_address(pool: Any) -> tuple[str, list[str]]:
    """The address a given pool connects to, and its passwords, as far as asyncpg tells."""
    args = getattr(pool, "_connect_args", None) or [None]
    kwargs = dict(getattr(pool, "_connect_kwargs", None) or {})
    dsn = args[0] if isinstance(args[0], str) else None
    secrets = _dsn_secrets(dsn, kwargs)
    host, port = kwargs.get("host"), kwargs.get("port")
    if isinstance(host, str) and host:
        return (f"{host}:{port}" if port else host), secrets
    return (_dsn_address(dsn) if dsn else "the pool's server"), secrets


#: Fence rows of the read-write lock and the semaphore start with a byte that
#: no UTF-8 text starts with, so they never meet a plain lock's row.
_RW_ROW = b"\xffrw\0"
_SEM_ROW = b"\xffsem\0"
#: The fence table's epoch row: there from the table's creation until a crash
#: empties the (unlogged) table; see ``_create_table``.
_EPOCH_ROW = b"\xffepoch\0"
#: A semaphore's fence row records the permits of its holders in ``k1`` when
#: ``k2`` is this mark (rows of earlier versions hold the gate's key there).
_PERMITS_MARK = -1


def _digest_key(person: bytes, data: bytes) -> Key:
    high, low = struct.unpack(">ii", hashlib.blake2b(data, digest_size=8, person=person).digest())
    return high, low


@functools.lru_cache(maxsize=4096)
def advisory_key(prefix: str, name: str) -> Key:
    """The two-int advisory lock key of ``name`` under ``prefix`` (stable across versions)."""
    return _digest_key(b"asynclock-key", f"{prefix}\0{name}".encode())


@functools.lru_cache(maxsize=1024)
def rw_key(prefix: str, name: str) -> Key:
    """The advisory key of the read-write lock ``name`` (unrelated to the plain lock's)."""
    return _digest_key(b"asynclock-rw", f"{prefix}\0{name}".encode())


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
def _slot_arrays(prefix: str, name: str, permits: int) -> tuple[list[int], list[int]]:
    keys = [slot_key(prefix, name, slot) for slot in range(permits)]
    return [k[0] for k in keys], [k[1] for k in keys]


def _channel(prefix: str, name: str) -> str:
    """The LISTEN/NOTIFY channel of the semaphore ``name`` (hex digits only: safe to inline)."""
    digest = hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=8, person=b"asynclock-chan").hexdigest()
    return f"asynclock_{digest}"


@functools.lru_cache(maxsize=4096)
def name_check(prefix: str, name: str) -> str:
    """8 hex digits from a digest independent of the key: tells colliding names apart."""
    return hashlib.blake2b(f"{prefix}\0{name}".encode(), digest_size=4, person=b"asynclock-chk").hexdigest()


def _quote_ident(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


def _table_sql(table: str) -> str:
    return ".".join(_quote_ident(part) for part in table.split(".", 1))


def _ms(seconds: float) -> str:
    """Seconds as a GUC value in ms, rounded up and never 0 (0 would mean 'no limit')."""
    return str(max(1, math.ceil(seconds * 1000)))


#: Server errors that no retry fixes: the server refused this client's configuration.
_REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,  # 28000: no such role, pg_hba.conf; 28P01: password
    asyncpg.InvalidCatalogNameError,  # 3D000: no such database
    asyncpg.InsufficientPrivilegeError,  # 42501: permission denied (the fence table, its schema)
    asyncpg.InvalidSchemaNameError,  # 3F000: table= names a schema that does not exist
    asyncpg.UndefinedObjectError,  # 42704: e.g. an unknown server setting in the URL
    asyncpg.CantChangeRuntimeParamError,  # 55P02: a server setting that cannot be set per session
    asyncpg.InvalidParameterValueError,  # 22023: a bad value for a server setting
)


def _cause(exc: BaseException) -> str:
    """Why a request or a connection attempt failed, in a few words."""
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionRefusedError) or (
        # (asyncio's "Multiple exceptions" of a name with several addresses)
        isinstance(exc, OSError) and exc.errno is None and f"[Errno {errno.ECONNREFUSED}]" in str(exc)
    ):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _hint(exc: BaseException, table: str) -> str:
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return (
            f" (this role needs SELECT, INSERT and UPDATE on the fence table {table}, and CREATE on its"
            " schema while the table does not exist; table= chooses another)"
        )
    return ""


class _Edge:
    """Translate client errors at the backend's edge (nothing of asyncpg leaks out).

    ``with self._edge:`` (around awaits too) on the hot paths, where an async
    generator would cost a frame and a loop hook per request; ``async with
    self._edge, ...`` where it is combined with other async context managers.
    Messages name the server's address and never a password.
    """

    __slots__ = ("address", "secrets", "table")

    def __init__(self, address: str = "?", secrets: Sequence[str] = (), table: str = "") -> None:
        self.address = address
        self.secrets = tuple(secrets)
        self.table = table

    def translate(self, exc: BaseException) -> BaseException:
        """Map asyncpg (and socket) errors onto ours; the caller keeps the original as ``__cause__``."""
        if isinstance(exc, LockError):
            return exc
        where = f"PostgreSQL at {self.address}"
        if isinstance(exc, _REFUSED):
            return ConfigurationError(self.mask(f"{where} refused: {exc}{_hint(exc, self.table)}"))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ConfigurationError(self.mask(f"{where}: TLS certificate refused: {exc.verify_message or exc}"))
        if isinstance(exc, asyncpg.ClientConfigurationError):
            return ConfigurationError(self.mask(f"bad connection settings for {where}: {exc}"))
        if isinstance(
            exc,
            (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                asyncpg.CannotConnectNowError,
                asyncpg.TooManyConnectionsError,
                asyncpg.AdminShutdownError,
                asyncpg.CrashShutdownError,
                OSError,
                TimeoutError,
            ),
        ):
            return BackendUnavailable(self.mask(f"{where}: {_cause(exc)}"))
        if isinstance(exc, asyncpg.PostgresError):
            return LockError(self.mask(f"{where}: {exc!r}"))
        return exc

    def mask(self, text: str) -> str:
        return mask_text(text, self.secrets)

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or not isinstance(exc, _CLIENT_ERRORS):
            return
        translated = self.translate(exc)
        if translated is not exc:
            raise translated from exc

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def _is_closed(conn: Any) -> bool:
    """Whether a pool connection is closed (a proxy the pool took back after a close counts as closed)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


def _terminate(conn: Any) -> None:
    """Close a pool connection's socket now; its session, and every lock of it, ends with it."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


def _quiet(task: asyncio.Task[Any]) -> None:
    """Done callback: fetch a background task's exception so it is never reported as unretrieved."""
    if not task.cancelled():
        task.exception()


@dataclass(eq=False, slots=True)
class _Hold:
    """One held advisory lock (or permit) and the connection (session) that holds it."""

    name: str
    shape: Shape
    conn: Any  # an asyncpg pool connection
    ttl: float
    cleanup: str  # gives the connection back in a known state (locks and settings undone)
    cleanup_args: tuple[Any, ...] = ()
    listener: tuple[str, Callable[..., None]] | None = field(default=None, repr=False)  # to UNLISTEN
    hooks: BackendHooks | None = field(default=None, repr=False)
    count: int = 1
    lost: bool = False
    released: bool = False
    ping: asyncio.Task[Any] | None = None
    on_close: Callable[[Any], None] | None = field(default=None, repr=False)


@dataclass(slots=True)
class _Attempt:
    """What one acquire did to its connection, so that giving it back undoes exactly that."""

    dirty: bool = False  # a lock statement was sent: something may be locked or set
    before: tuple[str, str | None] | None = None  # the settings the grant replaced
    reset_check: bool = False  # client_connection_check_interval was set for this wait
    notify: str | None = None  # a semaphore's channel: giving the connection back NOTIFYs it
    listener: Callable[..., None] | None = None  # LISTENing on that channel (a waiter) with this callback


class PostgresBackend:
    """Locks on one PostgreSQL server (advisory locks on leased connections)."""

    kind = "postgres"
    queues_waiters = True

    def __init__(
        self,
        pool: Any = None,
        *,
        dsn: str | None = None,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | None = None,
        pool_options: dict[str, Any] | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if (pool is None) == (dsn is None):
            raise TypeError("PostgresBackend needs exactly one of an asyncpg pool or a dsn")
        if max_leases is not None and (isinstance(max_leases, bool) or not isinstance(max_leases, int)):
            raise TypeError(f"max_leases must be int, not {type(max_leases).__name__}")
        if max_leases is not None and max_leases < 1:
            raise ValueError(f"max_leases must be at least 1, got {max_leases}")
        if table is not None and (not isinstance(table, str) or not table):
            raise ValueError(f"table must be a non-empty str, got {table!r}")
        self._pool: Any = pool
        self._owns_pool = pool is None
        self._dsn = dsn
        self._pool_options = dict(pool_options or {})
        self._connect_timeout = connect_timeout
        self._pool_options.setdefault("timeout", connect_timeout)
        self._prefix = prefix
        self._table = table if table is not None else f"{prefix}_fence"
        if pool is None:
            address, secrets = _dsn_address(dsn or ""), _dsn_secrets(dsn, self._pool_options)
        else:
            address, secrets = _pool_address(pool)
        self._edge = _Edge(address, secrets, self._table)
        if max_leases is None:
            max_leases = DEFAULT_MAX_LEASES if pool is None else max(1, pool.get_max_size() // 2)
        self._max_leases = max_leases
        self._key_of: Callable[[str], Key] = lambda name: advisory_key(prefix, name)
        self._holds: dict[str, _Hold] = {}
        self._hooks: BackendHooks | None = None
        self._slots: asyncio.Semaphore | None = None
        self._probe: asyncio.Task[bool] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._starting: asyncio.Task[None] | None = None
        self._pg14 = True  # PostgreSQL 14+: idle_session_timeout, client_connection_check_interval
        # Whether every connection of the pool already runs with
        # client_connection_check_interval (asynclock's own pool sets it once
        # per connection; a given pool's connections get it per wait).
        self._checked = False
        self._sql: dict[str, str] = {}
        # Lease connections this backend gave back to the pool clean and has
        # not taken again: while there are some, a checkout most likely needs
        # no connect (the pool hands out its latest connection first; info
        # and probes, or the application with a given pool, may take it).
        self._warm = 0
        # Clean lease connections kept for the next acquire (own pool only).
        # (connection, when it goes back to the pool, clean-up bound), latest last;
        # one timer sweeps them, so parking a connection arms no timer of its own.
        self._parked: list[tuple[Any, float, float]] = []
        self._sweep: asyncio.TimerHandle | None = None
        # The hot requests (a try, a release) in flight: connection -> the loop
        # time by which it must have answered, else it is closed (its session,
        # and its locks, end with it). One timer watches them all, instead of
        # a timer per request.
        self._inflight: dict[Any, float] = {}
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = math.inf
        # asyncpg's own statement timeout for those requests: none (no timer)
        # on asynclock's own pool unless command_timeout was asked for; on a
        # given pool one that never fires first, so its command_timeout does
        # not cut our requests short.
        self._hot_timeout: float | None = (
            None if pool is None and "command_timeout" not in self._pool_options else _NO_COMMAND_TIMEOUT
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock",
        table: str | None = None,
        max_leases: int | str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> PostgresBackend:
        """A backend with its own pool for ``url`` (closed by ``aclose``).

        ``options`` go to ``asyncpg.create_pool`` (e.g. ``password=``, ``ssl=``).
        URL query parameters: asynclock's own (``table``, ``max_leases``),
        those asyncpg reads (:data:`DSN_PARAMETERS`: ``sslmode``, ``user``, …),
        and server settings, which asyncpg sends to the server
        (``?application_name=app``). A parameter that is none of these but
        looks like a typo of an option (``?max_lease=3``) raises ValueError
        here, before any I/O, naming the closest; so does an unknown keyword
        option. A setting the server does not know fails when connecting,
        with ConfigurationError.
        """
        for own in _SIZES:
            if own in options:
                raise ValueError(f"{own} is chosen by asynclock; use max_leases= to size the pool")
        valid_query = OWN_OPTIONS | DSN_PARAMETERS
        for name in query_names(url):
            if name not in valid_query and _typo(name, valid_query):
                reject_unknown(
                    [name], valid_query, "postgresql:// (other query parameters go to the server as settings)"
                )
        reject_unknown(options, keyword_options(), "postgresql://")
        # asyncpg would send our query parameters to the server as settings:
        # take them out first.
        url, query = take_query(url, {"table", "max_leases"})
        max_leases = query.get("max_leases", max_leases)
        table = query.get("table", table)
        if isinstance(max_leases, str):
            try:
                max_leases = int(max_leases)
            except ValueError as exc:
                raise ValueError(f"bad max_leases: {max_leases!r}") from exc
        return cls(
            dsn=url,
            prefix=prefix,
            table=table,
            max_leases=max_leases,
            pool_options=options,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def from_pool(
        cls,
        pool: Any,
        *,
        prefix: str = "asynclock",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> PostgresBackend:
        """A backend on a given ``asyncpg.Pool`` (not closed by ``aclose``).

        Options: ``table=``, ``max_leases=``; any other raises ValueError naming them.
        """
        reject_unknown(options, {"ttl", "prefix", "connect_timeout", "table", "max_leases"}, "an asyncpg pool")
        return cls(pool, prefix=prefix, connect_timeout=connect_timeout, **options)

    @property
    def pool(self) -> Any:
        """The asyncpg pool in use (None before ``start`` when asynclock opens it)."""
        return self._pool

    @property
    def max_leases(self) -> int:
        return self._max_leases

    # -- keys -------------------------------------------------------------------

    def lock_key(self, name: str) -> str:
        high, low = self._key_of(name)
        return f"pg_advisory({high},{low})"

    def primitive(self, shape: Shape) -> Backend:
        """Every shape: the fair lock (the plain lock itself), read-write lock, semaphore."""
        if shape == LOCK:
            return self
        return _PostgresShape(self, shape)

    def _app_name(self, name: str, hold: str) -> str:
        return f"{APP_TAG} {name_check(self._prefix, name)} {hold}"[:APP_NAME_MAX]

    def _main_key(self, shape: Shape, name: str) -> Key:
        """The key a hold of ``shape`` locks (a semaphore: the gate its waiters queue on)."""
        if shape.kind in ("read", "write"):
            return rw_key(self._prefix, name)
        if shape.kind == "semaphore":
            return gate_key(self._prefix, name)
        return self._key_of(name)

    @staticmethod
    def _row(shape: Shape, name: str) -> bytes:
        """The fence table row (token counter) of ``name``'s ``shape``."""
        if shape.kind in ("read", "write"):
            return _RW_ROW + name.encode()
        if shape.kind == "semaphore":
            return _SEM_ROW + name.encode()
        return name.encode()

    # -- protocol ---------------------------------------------------------------

    def lease_time(self, ttl: float) -> float:
        # The server ends a lease connection idle for ttl (idle_session_timeout),
        # counted from the end of its last statement, which is after that
        # statement was sent.
        return ttl

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        await self._ready()

    async def _ready(self) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_leases)
        # The set-up runs in its own task: a caller cancelled meanwhile (the
        # first acquire starts the client) does not cut a connection attempt
        # in half; the next call waits for the same set-up.
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._start())
            task.add_done_callback(_quiet)
        await asyncio.shield(task)

    async def _start(self) -> None:
        if self._pool is None:
            options = dict(self._pool_options)
            if "reset" in inspect.signature(asyncpg.create_pool).parameters:
                # Lease connections undo their own settings and lock when they
                # are given back; the pool's RESET ALL round trip is not needed.
                options.setdefault("reset", _no_reset)
            options["init"] = _with_check_interval(options.get("init"))
            async with self._edge, asyncio.timeout(ADMIN_TIMEOUT):
                self._pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=self._max_leases + 1, **options)
        async with self._edge, self._borrow(ADMIN_TIMEOUT) as conn:
            version = int(await conn.fetchval("SELECT current_setting('server_version_num')"))
            self._pg14 = version >= 140000
            await self._create_table(conn)
        self._checked = self._owns_pool and self._pg14
        self._prepare_sql()

    async def _create_table(self, conn: Any) -> None:
        """Create the fence table (unlogged) with its epoch row, unless it is there already.

        The epoch row is written in the transaction that creates the table, so
        it exists exactly while no crash has emptied the table: a name's
        first token is then 1, and after a crash (no epoch row) it is the
        server time in µs, above every token handed out before.
        """
        table = _table_sql(self._table)
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
            return  # (a table of an earlier version stays logged, and works the same)
        try:
            async with conn.transaction():
                # Durable whatever the server's setting: a table lost in a crash
                # would come back new, with an epoch row, and count from 1 again.
                await conn.execute("SET LOCAL synchronous_commit = on")
                await conn.execute(
                    f"CREATE UNLOGGED TABLE {table} ("
                    "name bytea PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL, value bigint NOT NULL)"
                )
                await conn.execute(f"INSERT INTO {table} (name, k1, k2, value) VALUES ($1, 0, 0, 0)", _EPOCH_ROW)
        except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError):
            # Another client created it at the same moment (its error comes
            # once the winner committed): the winner's table, epoch row included.
            pass

    def _prepare_sql(self) -> None:
        table = _table_sql(self._table)

        def idle(param: int) -> str:
            # PostgreSQL 14+: a hung holder's session ends a ttl after its last statement.
            return f"set_config('idle_session_timeout', ${param}, false)" if self._pg14 else f"${param}::text"

        # The session's own values, read before the hold changes them, so that
        # the release can put them back in the statement that unlocks.
        before = "current_setting('application_name') AS app0, " + (
            "current_setting('idle_session_timeout') AS idle0" if self._pg14 else "NULL::text AS idle0"
        )
        restore = "(SELECT app0 FROM cfg) AS app0, (SELECT idle0 FROM cfg) AS idle0"

        # A name's first token: one above the epoch row's value (0), or, when a
        # crash has emptied the table (no epoch row), above the server time in µs.
        first = (
            f"coalesce((SELECT e.value FROM {table} e WHERE e.name = decode('{_EPOCH_ROW.hex()}', 'hex')),"
            " (extract(epoch from clock_timestamp()) * 1000000)::int8) + 1"
        )

        def fence(row: int, source: str, granted: str) -> str:
            return f"""fence AS (
                INSERT INTO {table} AS f (name, k1, k2, value)
                SELECT ${row}::bytea, $1, $2, {first} FROM {source} WHERE {granted}
                ON CONFLICT (name) DO UPDATE SET value = f.value + 1, k1 = EXCLUDED.k1, k2 = EXCLUDED.k2
                RETURNING f.value
            )"""

        # Locks. $1, $2 key; $3 fence row (bytea: a name may hold NUL, which
        # text cannot); $4 application_name; $5 idle_session_timeout (ms);
        # $6 lock_timeout (ms, '0' = no limit; local to the statement's
        # transaction: a try waits for nothing but a fence row another
        # transaction holds). Returns (ok, token). The lock is taken first; the
        # session settings and the token only when it was granted, all in one
        # round trip.
        lock_template = f"""
            WITH got AS MATERIALIZED (
                SELECT {{lead}} {{lock}} AS ok
            ), cfg AS MATERIALIZED (
                SELECT {before}, set_config('application_name', $4, false) AS app, {idle(5)} AS idle
                FROM got WHERE ok
            ), {fence(3, "got", "ok")}
            SELECT (SELECT ok FROM got) AS ok, (SELECT value FROM fence) AS token, {restore}
        """
        # (A select list is evaluated in order: lock_timeout is set before the wait starts.)
        lead = "set_config('lock_timeout', $6, true) AS lt,"
        for side, suffix in (("x", ""), ("s", "_shared")):
            try_lock = f"pg_try_advisory_lock{suffix}($1::int4, $2::int4)"
            wait_lock = f"pg_advisory_lock{suffix}($1::int4, $2::int4) IS NOT NULL"
            self._sql[f"try_{side}"] = lock_template.replace("{lead}", lead).replace("{lock}", try_lock)
            self._sql[f"wait_{side}"] = lock_template.replace("{lead}", lead).replace("{lock}", wait_lock)

        # Semaphore slots. $1, $2 the gate key; $3, $4 the slot keys (int4[]
        # each: their number is the permits); $5 fence row; $6
        # application_name; $7 idle_session_timeout; $8, $9 the permits key;
        # $10 lock_timeout.
        # Returns (slot, token, permits, mark): the first free slot, locked, or
        # NULL, and the permits the fence row records (see _check_permits). A
        # newcomer takes the gate shared for the statement's length, so it
        # fails while anybody waits (they hold or queue for it exclusively);
        # the head waiter holds the gate and lets it go with the slot it got.
        # A hold takes the permits key shared; the row records the permits
        # when it is made, and later only through _check_permits.
        sem_template = f"""
            WITH gate AS MATERIALIZED (
                SELECT set_config('lock_timeout', $10, true) AS lt, {{gate}} AS open
            ), slot AS MATERIALIZED (
                SELECT t.n FROM gate, unnest($3::int4[], $4::int4[]) WITH ORDINALITY AS t(k1, k2, n)
                WHERE CASE WHEN gate.open THEN pg_try_advisory_lock(t.k1, t.k2) ELSE false END
                LIMIT 1
            ), got AS MATERIALIZED (
                SELECT (SELECT n FROM slot) AS n, (SELECT open FROM gate) AS open
            ), shut AS MATERIALIZED (
                SELECT {{shut}} AS done FROM got WHERE {{shut_when}}
            ), cfg AS MATERIALIZED (
                SELECT {before}, set_config('application_name', $6, false) AS app, {idle(7)} AS idle,
                       pg_advisory_lock_shared($8::int4, $9::int4) AS mine
                FROM got WHERE n IS NOT NULL
            ), fence AS (
                INSERT INTO {table} AS f (name, k1, k2, value)
                SELECT $5::bytea, cardinality($3::int4[]), {_PERMITS_MARK}, {first} FROM got WHERE n IS NOT NULL
                ON CONFLICT (name) DO UPDATE SET value = f.value + 1
                RETURNING f.value, f.k1, f.k2
            ), known AS MATERIALIZED (
                SELECT k1, k2 FROM fence
                UNION ALL
                SELECT r.k1, r.k2 FROM {table} r, got WHERE got.n IS NULL AND r.name = $5::bytea
            )
            SELECT (SELECT n FROM got) AS slot, (SELECT value FROM fence) AS token, {restore},
                   (SELECT count(*) FROM shut) AS shut,
                   (SELECT k1 FROM known) AS permits, (SELECT k2 FROM known) AS mark
        """
        self._sql["sem_try"] = (
            sem_template.replace("{gate}", "pg_try_advisory_lock_shared($1::int4, $2::int4)")
            .replace("{shut}", "pg_advisory_unlock_shared($1::int4, $2::int4)")
            .replace("{shut_when}", "open")
        )
        self._sql["sem_head"] = (
            sem_template.replace("{gate}", "true")
            .replace("{shut}", "pg_advisory_unlock($1::int4, $2::int4)")
            .replace("{shut_when}", "n IS NOT NULL")
        )
        # The semaphore's queue: $1, $2 the gate key; $3 lock_timeout; $4
        # idle_session_timeout (the head waits idle between its tries, and a
        # hung head must not keep the gate).
        self._sql["sem_gate"] = (
            f"SELECT set_config('lock_timeout', $3, true) AS lt, {idle(4)} AS idle,"
            " pg_advisory_lock($1::int4, $2::int4) IS NOT NULL AS ok"
        )
        # The release of a hold that changed nothing else: unlock and put the
        # session's settings back, one prepared statement. $1 application_name,
        # $2 idle_session_timeout.
        idle_back = ", set_config('idle_session_timeout', $2, false)" if self._pg14 else ", $2::text"
        self._sql["release"] = f"SELECT pg_advisory_unlock_all(), set_config('application_name', $1, false){idle_back}"
        # A semaphore's: $3 its channel, whose head waiter then tries again.
        self._sql["release_notify"] = self._sql["release"] + ", pg_notify($3, '')"

    def _cleanup_sql(self, attempt: _Attempt) -> str:
        """Undo a lease connection's locks and settings (simple protocol: one round trip)."""
        # Every advisory lock of the session is this hold's (one hold per
        # connection, and the pool hands out connections without any).
        parts = ["SELECT pg_advisory_unlock_all()", "RESET application_name"]
        if self._pg14:
            parts.append("RESET idle_session_timeout")
        if attempt.reset_check:
            parts.append("RESET client_connection_check_interval")
        if attempt.notify is not None:
            # A permit (or the head's place) was given back: the head waiter tries again.
            parts.append(f"SELECT pg_notify('{attempt.notify}', '')")
        return "; ".join(parts)

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        got = await self.wait_acquire(name, hold, ttl, 0.0)
        return Busy(None) if got is None else got

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        return await self._acquire(LOCK, self._hooks, name, hold, ttl, timeout)

    async def _acquire(
        self, shape: Shape, hooks: BackendHooks | None, name: str, hold: str, ttl: float, timeout: float | None
    ) -> Acquired | None:
        slots = self._slots
        if slots is None or self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # A place among this client's lease connections: waiting for one is
        # waiting for the lock (FIFO), within the caller's time.
        if slots.locked():
            try:
                async with asyncio.timeout_at(deadline if deadline is None else max(deadline, loop.time() + 0.001)):
                    await slots.acquire()
            except TimeoutError:
                return None
        else:
            await slots.acquire()  # free: returns at once
        conn: Any = None
        attempt = _Attempt()
        result: Acquired | None = None
        try:
            conn = self._take_parked()  # a connection kept from a release: no pool hand-over
            if conn is None:
                # Connecting takes what it takes, but never longer than the lease
                # time or the caller's time, whichever is longer.
                connect_by = loop.time() + ttl if deadline is None else max(deadline, loop.time() + ttl)
                conn = await self._checkout(connect_by)
            if shape.kind == "semaphore":
                result = await self._take_permit(conn, shape, name, hold, ttl, deadline, attempt)
            else:
                result = await self._take_lock(conn, shape, name, hold, ttl, deadline, attempt)
            if result is not None:
                self._keep(conn, shape, hooks, name, hold, ttl, attempt)
        except BaseException:
            try:
                if conn is not None:
                    # Whatever the statement got, give it back before the error goes on.
                    await self._give_back(
                        conn, self._cleanup_sql(attempt) if attempt.dirty else None, ttl, listener=_listening(attempt)
                    )
            finally:
                slots.release()
            raise
        if result is None:
            # A wait can end in lock_timeout after the grant (on the fence
            # row's lock, should something else hold it): the session lock
            # outlives the statement's error, so the clean-up unlocks it. A
            # try that said no got nothing and set nothing.
            try:
                await self._give_back(
                    conn, self._cleanup_sql(attempt) if attempt.dirty else None, ttl, listener=_listening(attempt)
                )
            finally:
                slots.release()
        return result

    async def _take_lock(
        self, conn: Any, shape: Shape, name: str, hold: str, ttl: float, deadline: float | None, attempt: _Attempt
    ) -> Acquired | None:
        """Take a lock (or a read or write side) on ``conn``: Acquired, or None when the time ran out."""
        loop = asyncio.get_running_loop()
        key = self._main_key(shape, name)
        side = "s" if shape.kind == "read" else "x"
        args = (key[0], key[1], self._row(shape, name), self._app_name(name, hold), _ms(ttl))
        # Try first: an uncontended acquire is this one round trip.
        sent = loop.time()
        row = await self._try(conn, self._sql[f"try_{side}"], ttl, deadline, attempt, *args)
        if row is not None and row["ok"]:
            attempt.before = (row["app0"], row["idle0"])
            return Acquired(int(row["token"]), confirmed_at=sent)
        if deadline is not None and deadline <= loop.time():
            return None
        await self._arm_check(conn, ttl, attempt)
        sent = loop.time()
        lock_timeout = "0" if deadline is None else _ms(deadline - sent)
        attempt.dirty = True
        row = await self._wait(conn, ttl, deadline, self._sql[f"wait_{side}"], *args, lock_timeout)
        if row is None or not row["ok"]:
            return None
        attempt.before = (row["app0"], row["idle0"])
        return await self._confirm(conn, ttl, int(row["token"]), sent)

    async def _take_permit(
        self, conn: Any, shape: Shape, name: str, hold: str, ttl: float, deadline: float | None, attempt: _Attempt
    ) -> Acquired | None:
        """Take a permit of a semaphore on ``conn``: Acquired, or None when the time ran out."""
        loop = asyncio.get_running_loop()
        gate = gate_key(self._prefix, name)
        highs, lows = _slot_arrays(self._prefix, name, shape.permits)
        mine = permits_key(self._prefix, name, shape.permits)
        fence_row = self._row(shape, name)
        args = (gate[0], gate[1], highs, lows, fence_row, self._app_name(name, hold), _ms(ttl), mine[0], mine[1])
        attempt.notify = _channel(self._prefix, name)
        sent = loop.time()
        row = await self._try(conn, self._sql["sem_try"], ttl, deadline, attempt, *args)
        if row is not None:
            # (before any wait: a client with another number never queues)
            await self._check_permits(conn, name, shape.permits, fence_row, row, ttl)
        if row is not None and row["slot"] is not None:
            attempt.before = (row["app0"], row["idle0"])
            return Acquired(int(row["token"]), confirmed_at=sent)
        if deadline is not None and deadline <= loop.time():
            return None
        # Wait: queue for the gate; as its holder (the head), listen for
        # releases and try the slots again at each one.
        await self._arm_check(conn, ttl, attempt)
        released = asyncio.Event()

        def on_release(*_: Any) -> None:
            released.set()

        attempt.dirty = True
        attempt.listener = on_release
        async with self._edge, asyncio.timeout_at(loop.time() + ttl):
            await conn.add_listener(attempt.notify, on_release)
        lock_timeout = "0" if deadline is None else _ms(max(deadline - loop.time(), 0.001))
        row = await self._wait(conn, ttl, deadline, self._sql["sem_gate"], gate[0], gate[1], lock_timeout, _ms(ttl))
        if row is None or not row["ok"]:
            return None
        # The head waits idle between tries: well within its idle_session_timeout (ttl).
        recheck = max(0.005, min(ttl / 3, RECHECK_MAX))
        while True:
            released.clear()
            sent = loop.time()
            # Only a fence row held elsewhere makes it wait: up to the deadline.
            lock_timeout = "0" if deadline is None else _ms(max(deadline - sent, 0.001))
            async with self._edge, asyncio.timeout_at(sent + ttl):
                try:
                    row = await conn.fetchrow(self._sql["sem_head"], *args, lock_timeout)
                except asyncpg.LockNotAvailableError:
                    return None  # out of time (the clean-up unlocks whatever it got)
            if row["slot"] is not None:
                await self._check_permits(conn, name, shape.permits, fence_row, row, ttl)
                attempt.before = (row["app0"], row["idle0"])
                return Acquired(int(row["token"]), confirmed_at=sent)
            now = loop.time()
            if deadline is not None and now >= deadline:
                return None
            pause = recheck if deadline is None else min(recheck, deadline - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await released.wait()

    async def _check_permits(self, conn: Any, name: str, permits: int, fence_row: bytes, row: Any, ttl: float) -> None:
        """ValueError if the semaphore ``name`` is held with another number of permits than ``permits``.

        ``row`` is the answer of a semaphore statement: the permits its fence
        row records. Every hold takes :func:`permits_key` of its number
        shared, so a number is in use while that key cannot be taken
        exclusively. The record changes only when it differs from ours and
        its number is no longer in use (a client of the new number holds a
        slot by then), under the row's lock, so two clients that disagree
        never both hold. Costs nothing while the record matches.
        """
        if row["permits"] == permits and row["mark"] == _PERMITS_MARK:
            return
        if row["permits"] is None:
            return  # nothing recorded yet: the first hold records it
        table = _table_sql(self._table)
        granted = row["slot"] is not None
        async with self._edge, asyncio.timeout(ttl), conn.transaction():
            current = await conn.fetchrow(f"SELECT k1, k2 FROM {table} WHERE name = $1 FOR UPDATE", fence_row)
            if current is None or (current["k1"] == permits and current["k2"] == _PERMITS_MARK):
                return
            if current["k2"] == _PERMITS_MARK:  # (else a row of an earlier version: no number to check)
                theirs = int(current["k1"])
                key = permits_key(self._prefix, name, theirs)
                in_use = await conn.fetchval(
                    "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4)"
                    " THEN NOT pg_advisory_unlock($1::int4, $2::int4) ELSE true END",
                    *key,
                )
                if in_use:
                    raise ValueError(
                        f"semaphore {name!r} is held with permits={theirs} by other clients; this one asks for"
                        f" permits={permits}: every client of a semaphore must use the same number"
                    )
            if granted:
                await conn.execute(
                    f"UPDATE {table} SET k1 = $2, k2 = {_PERMITS_MARK} WHERE name = $1", fence_row, permits
                )

    async def _try(self, conn: Any, sql: str, ttl: float, deadline: float | None, attempt: _Attempt, *args: Any) -> Any:
        """Run a try statement: its row, or None when it waited for a fence row past ``lock_timeout``.

        A try waits for nothing but a fence row another transaction holds
        (an application's ``SELECT ... FOR UPDATE``, another prefix sharing
        the table): for the caller's time, or a request window with
        ``timeout=0``. Then whatever it locked is unlocked again (its
        settings went with its transaction), and the connection is clean.
        """
        loop = asyncio.get_running_loop()
        sent = loop.time()
        window = min(ttl / 3, 1.0) if deadline is None or deadline <= sent else deadline - sent
        attempt.dirty = True
        with self._edge:
            try:
                self._bound(conn, sent + ttl)
                try:
                    row = await conn.fetchrow(sql, *args, _ms(min(window, ttl)), timeout=self._hot_timeout)
                finally:
                    self._inflight.pop(conn, None)
            except asyncpg.LockNotAvailableError:
                row = None
            else:
                if row[0] is not None and row[0] is not False:
                    return row  # granted: the clean-up undoes it when the hold ends
            if row is None:
                async with asyncio.timeout_at(loop.time() + ttl):
                    await conn.execute("SELECT pg_advisory_unlock_all()")
        attempt.dirty = False  # refused: nothing locked, nothing set
        return row

    async def _arm_check(self, conn: Any, ttl: float, attempt: _Attempt) -> None:
        """Before a wait on a connection without it: set client_connection_check_interval.

        A waiting session does not read its socket: without this check a
        waiter whose client is gone (crashed, or closed the connection) stays
        queued as a ghost until its turn comes. The server arms the check when
        a statement starts, so it is set beforehand (one more round trip, on
        the waiting path of a given pool only; asynclock's own pool sets it
        once per connection).
        """
        if self._checked or not self._pg14:
            return
        attempt.dirty = True
        attempt.reset_check = True
        async with self._edge, asyncio.timeout_at(asyncio.get_running_loop().time() + ttl):
            await conn.execute(f"SET client_connection_check_interval = {CHECK_INTERVAL_MS}")

    async def _confirm(self, conn: Any, ttl: float, token: int, sent: float) -> Acquired:
        """The grant of a wait sent at ``sent``, with a send time the lease may count from."""
        loop = asyncio.get_running_loop()
        confirmed = sent
        if loop.time() - sent > ttl / 3:
            # A long wait: the grant's own send time is too old to count the
            # lease from. One ping on the lease connection, sent now, proves it.
            confirmed = loop.time()
            async with self._edge, asyncio.timeout_at(confirmed + ttl):
                await conn.fetchval("SELECT 1")
        return Acquired(token, confirmed_at=confirmed)

    def _keep(
        self, conn: Any, shape: Shape, hooks: BackendHooks | None, name: str, hold: str, ttl: float, attempt: _Attempt
    ) -> None:
        """Record a granted hold and watch its connection; raises if the connection is already gone."""
        args: tuple[Any, ...]
        if attempt.before is not None and not attempt.reset_check:
            cleanup, args = self._sql["release"], attempt.before
            if attempt.notify is not None:
                cleanup, args = self._sql["release_notify"], (*attempt.before, attempt.notify)
        else:
            cleanup, args = self._cleanup_sql(attempt), ()
        record = _Hold(name=name, shape=shape, conn=conn, ttl=ttl, cleanup=cleanup, cleanup_args=args, hooks=hooks)
        record.listener = _listening(attempt)
        record.on_close = on_close = self._on_close_callback(hold)
        with contextlib.suppress(asyncpg.InterfaceError):  # a proxy the pool took back: closed
            conn.add_termination_listener(on_close)
        if _is_closed(conn):
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_termination_listener(on_close)
            raise BackendUnavailable(
                f"PostgreSQL at {self._edge.address}: the connection closed right after the lock was granted"
            )
        self._holds[hold] = record

    async def _wait(self, conn: Any, ttl: float, deadline: float | None, sql: str, *args: Any) -> Any:
        """Run the blocking statement: its row, or None when ``lock_timeout`` ended the wait.

        Bounded by the deadline (plus a grace) and by server liveness.

        While it waits, the server is probed every ttl on another connection,
        so a server that went silent (paused, cut off) is not waited for
        forever; a silent server raises BackendUnavailable.
        """
        loop = asyncio.get_running_loop()
        grace = max(0.1, min(ttl / 3, 2.0))
        # Our own bounds apply, not the pool's command_timeout.
        task = loop.create_task(conn.fetchrow(sql, *args, timeout=_NO_COMMAND_TIMEOUT))
        task.add_done_callback(_quiet)
        try:
            while True:
                now = loop.time()
                step = ttl if deadline is None else min(ttl, deadline + grace - now)
                done, _ = await asyncio.wait({task}, timeout=max(step, 0.0))
                if done:
                    if isinstance(task.exception(), asyncpg.LockNotAvailableError):
                        return None  # lock_timeout: the server gave up waiting
                    with self._edge:
                        return task.result()
                if deadline is not None and loop.time() >= deadline + grace:
                    raise BackendUnavailable(
                        f"PostgreSQL at {self._edge.address}: no answer within the acquire timeout"
                    )
                if not await self._server_alive(ttl):
                    raise BackendUnavailable(
                        f"PostgreSQL at {self._edge.address}: stopped answering while the lock was awaited"
                    )
        finally:
            if not task.done():
                # asyncpg sends a CancelRequest; the next statement on this
                # connection waits until the server acknowledged it. The
                # statement's task must see its cancellation first, or that
                # next statement would find the connection still busy.
                task.cancel()
                await asyncio.wait({task}, timeout=CLEANUP_TIMEOUT)

    async def _server_alive(self, within: float) -> bool:
        """One shared probe at a time: can a connection of the pool run ``SELECT 1`` within ``within``?"""
        task = self._probe
        if task is None or task.done():
            task = self._probe = asyncio.get_running_loop().create_task(self._probe_once(within))
        return await asyncio.shield(task)

    async def _probe_once(self, within: float) -> bool:
        try:
            async with self._borrow(within) as conn:
                await conn.fetchval("SELECT 1")
        except _CLIENT_ERRORS as exc:
            logger.info("PostgreSQL liveness probe failed: %r", exc)
            return False
        return True

    def _on_close_callback(self, hold: str) -> Callable[[Any], None]:
        # (It finds the record by its hold id, which no other acquisition
        # shares: no reference cycle for the garbage collector to break.)
        def on_close(_conn: Any) -> None:
            record = self._holds.get(hold)
            if record is None or record.released or record.lost:
                return
            record.lost = True
            if record.hooks is not None:
                record.hooks.lose(
                    [hold], "the PostgreSQL connection holding the lock closed (terminated, restarted or cut off)"
                )

        return on_close

    async def _give_back(
        self,
        conn: Any,
        cleanup: str | None,
        ttl: float,
        *args: Any,
        listener: tuple[str, Callable[..., None]] | None = None,
        wait_for_pool: bool = True,
    ) -> bool:
        """Return ``conn`` to the pool in a known state (``cleanup`` run), else close it.

        Returns True if the connection went back clean, False if it was closed.
        Never raises but CancelledError, and a cancelled caller leaves the
        connection closed (its session, and so its locks, end with it). Without
        ``wait_for_pool`` the connection, clean, goes back to the pool in the
        background (the pool's own hand-over takes a task and a loop turn).
        """
        # A healthy server answers at once; one that does not is not waited
        # for: closing the connection ends the session, and its locks, too.
        bound = max(0.05, min(ttl / 3, CLEANUP_TIMEOUT))
        if _is_closed(conn):
            _terminate(conn)  # lets the pool take its holder back
            return False
        try:
            if listener is None and not wait_for_pool:
                # A release: one statement, bounded by the in-flight watch, then parked.
                if cleanup is not None:
                    self._bound(conn, asyncio.get_running_loop().time() + bound)
                    try:
                        await conn.execute(cleanup, *args, timeout=self._hot_timeout)
                    finally:
                        self._inflight.pop(conn, None)
                    if _is_closed(conn):  # closed by the watch (or the server) meanwhile
                        _terminate(conn)
                        return False
                self._park(conn, bound)
                return True
            async with asyncio.timeout(bound):
                if listener is not None:
                    await conn.remove_listener(*listener)  # UNLISTEN, and the callback is gone
                if cleanup is not None:
                    await conn.execute(cleanup, *args)
                # (None: nothing was granted, so nothing was set either.)
                if not wait_for_pool:
                    self._park(conn, bound)
                    return True
                await self._pool.release(conn)
        except asyncio.CancelledError:
            _terminate(conn)
            raise
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection in an unknown state: %r", exc)
            _terminate(conn)
            return False
        self._warm += 1
        return True

    def _bound(self, conn: Any, deadline: float) -> None:
        """Watch a request on ``conn``: unanswered by ``deadline`` (loop time), the connection is closed.

        The caller removes ``conn`` from ``_inflight`` once answered. A closed
        connection fails the request (``BackendUnavailable`` at the edge) and
        ends the session, so nothing it may have got outlives it.
        """
        self._inflight[conn] = deadline
        if deadline < self._watch_at:
            if self._watch is not None:
                self._watch.cancel()
            self._watch_at = deadline
            self._watch = asyncio.get_running_loop().call_at(deadline, self._check_inflight)

    def _check_inflight(self) -> None:
        """The watch: close the connections of overdue requests; come back for the earliest other one."""
        self._watch, self._watch_at = None, math.inf
        now = asyncio.get_running_loop().time()
        for conn, deadline in list(self._inflight.items()):
            if deadline <= now:
                del self._inflight[conn]
                logger.info("closing a PostgreSQL connection whose request went unanswered in time")
                _terminate(conn)
        if self._inflight:
            earliest = min(self._inflight.values())
            self._watch_at = earliest
            self._watch = asyncio.get_running_loop().call_at(earliest, self._check_inflight)

    def _park(self, conn: Any, bound: float) -> None:
        """Keep a clean lease connection for the next acquire a moment, else give it back to the pool."""
        if not self._owns_pool or len(self._parked) >= PARK_MAX:
            self._later(self._return(conn, bound))
            return
        loop = asyncio.get_running_loop()
        self._parked.append((conn, loop.time() + PARK_TIME, bound))
        if self._sweep is None:
            self._sweep = loop.call_later(PARK_TIME, self._sweep_parked)

    def _sweep_parked(self) -> None:
        """Give the connections parked for ``PARK_TIME`` back to the pool; come back for the rest."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        keep = []
        for conn, until, bound in self._parked:
            if until <= now:
                self._later(self._return(conn, bound))
            else:
                keep.append((conn, until, bound))
        self._parked = keep
        if keep:
            # the oldest goes first (every connection is parked for the same time)
            self._sweep = asyncio.get_running_loop().call_at(keep[0][1], self._sweep_parked)

    def _take_parked(self) -> Any:
        """A clean, open lease connection kept by ``_park`` (the latest), or None."""
        while self._parked:
            conn = self._parked.pop()[0]
            if not _is_closed(conn):
                return conn
            _terminate(conn)  # closed while parked: the pool takes its holder back
        return None

    async def _return(self, conn: Any, bound: float) -> None:
        """Give a clean lease connection back to the pool (a background task of ``_give_back``)."""
        try:
            async with asyncio.timeout(bound):
                await self._pool.release(conn)
        except Exception as exc:  # noqa: BLE001 - any doubt: close it
            logger.info("closing a PostgreSQL lease connection the pool did not take back: %r", exc)
            _terminate(conn)
            return
        self._warm += 1

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        record = self._holds.get(hold)
        if record is None or record.lost or _is_closed(record.conn):
            return False
        record.count = count
        return True

    async def release(self, name: str, hold: str) -> bool:
        record = self._holds.pop(hold, None)
        if record is None:
            return False
        record.released = True
        assert self._slots is not None
        conn = record.conn
        if record.on_close is not None:
            with contextlib.suppress(asyncpg.InterfaceError):  # a proxy the pool took back: closed
                conn.remove_termination_listener(record.on_close)
        alive = not record.lost and not _is_closed(conn)
        try:
            ping = record.ping
            if alive and ping is not None and not ping.done():
                # A ping still runs on the connection: give it a moment, else close.
                await asyncio.wait({ping}, timeout=record.ttl / 3)
                if not ping.done():
                    _terminate(conn)
            # Whether it goes back clean or is closed (ending the session), the
            # server no longer holds the lock for this hold.
            await self._give_back(
                conn, record.cleanup, record.ttl, *record.cleanup_args, listener=record.listener, wait_for_pool=False
            )
        except BaseException:
            _terminate(conn)
            raise
        finally:
            self._slots.release()
        return alive

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return list(await asyncio.gather(*(self._ping(item.hold) for item in items)))

    async def _ping(self, hold: str) -> bool | BaseException:
        """Prove the lease connection alive with a round trip sent now."""
        record = self._holds.get(hold)
        if record is None or record.lost or _is_closed(record.conn):
            return False
        loop = asyncio.get_running_loop()
        try:
            previous = record.ping
            if previous is not None and not previous.done():
                # An answer to an older ping would prove nothing about now:
                # let it finish, then send a new one.
                with contextlib.suppress(Exception):
                    await asyncio.shield(previous)
            if record.released or record.lost or _is_closed(record.conn):
                return False
            record.ping = loop.create_task(record.conn.fetchval("SELECT 1"))
            record.ping.add_done_callback(_quiet)
            await asyncio.shield(record.ping)
        except _CLIENT_ERRORS as exc:
            if record.lost or _is_closed(record.conn):
                return False
            translated = self._edge.translate(exc)
            translated.__cause__ = exc
            return translated
        return not record.lost

    async def subscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue wakes waiters itself."""

    async def unsubscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue wakes waiters itself."""

    async def info(self, name: str) -> LockInfo:
        return await self._info(LOCK, name, self.lock_key(name))

    async def _info(self, shape: Shape, name: str, key_text: str) -> LockInfo:
        if self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        main = self._main_key(shape, name)
        if shape.kind == "semaphore":
            highs, lows = _slot_arrays(self._prefix, name, shape.permits)
            held_keys = list(zip(highs, lows, strict=True))
        else:
            held_keys = [main]
        # pg_locks shows the two-int key as unsigned oids, objsubid 2.
        sql = """
            SELECT l.pid, l.granted, l.mode, a.application_name AS app,
                   l.classid::int8 = $1 AND l.objid::int8 = $2 AS main
            FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.objsubid = 2
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND ((l.classid::int8 = $1 AND l.objid::int8 = $2)
                   OR (l.classid::int8, l.objid::int8) IN (SELECT * FROM unnest($3::int8[], $4::int8[])))
            ORDER BY l.pid
        """
        fence = f"SELECT value FROM {_table_sql(self._table)} WHERE name = $1"
        async with self._edge, self._borrow(ADMIN_TIMEOUT) as conn:
            rows = await conn.fetch(
                sql,
                main[0] & 0xFFFFFFFF,
                main[1] & 0xFFFFFFFF,
                [k[0] & 0xFFFFFFFF for k in held_keys],
                [k[1] & 0xFFFFFFFF for k in held_keys],
            )
            token = await conn.fetchval(fence, self._row(shape, name))
        check = name_check(self._prefix, name)
        holders: list[str] = []
        waiters = 0
        for row in rows:
            if shape.kind == "semaphore" and row["main"]:
                # The gate: queued for it, or holding it as the head waiter (a
                # newcomer's instant shared hold is not waiting).
                if not row["granted"] or row["mode"] == "ExclusiveLock":
                    waiters += 1
                continue
            if not row["granted"]:
                waiters += 1
                continue
            parts = str(row["app"] or "").split(" ", 2)
            if len(parts) == 3 and parts[0] == APP_TAG:
                # Held for this name, or for another name whose key collides?
                if parts[1] == check:
                    holders.append(parts[2])
            else:
                holders.append(f"pid {row['pid']} ({row['app'] or 'not asynclock'})")
        owner = holders[0] if holders else None
        count = 0
        if owner is not None:
            mine = next(
                (h for hold, h in self._holds.items() if hold == owner and h.name == name and not h.lost),
                None,
            )
            count = mine.count if mine is not None else 1
        return LockInfo(
            name=name,
            key=key_text,
            owner=owner,
            hold_count=count,
            ttl=None,
            waiters=waiters,
            token=int(token) if owner is not None and token is not None else None,
            holders=tuple(holders),
        )

    async def names(self) -> list[str]:
        """Names under this client's table whose (plain or fair) lock is held right now."""
        if self._pool is None:  # closed meanwhile (or never started)
            raise BackendUnavailable("the PostgreSQL backend is closed")
        # The rows of read-write locks and semaphores start with a 0xff byte.
        sql = f"""
            SELECT f.name FROM {_table_sql(self._table)} f
            WHERE f.name < '\\xff'::bytea AND EXISTS (
                SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
                  AND l.classid::int8 = (f.k1::int8 & 4294967295) AND l.objid::int8 = (f.k2::int8 & 4294967295)
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            )
            ORDER BY f.name
        """
        async with self._edge, self._borrow(ADMIN_TIMEOUT) as conn:
            rows = await conn.fetch(sql)
        return [bytes(row["name"]).decode() for row in rows]

    async def aclose(self) -> None:
        # Holds the front could not release: closing their sessions ends them.
        for hold, record in list(self._holds.items()):
            self._holds.pop(hold, None)
            record.released = True
            _terminate(record.conn)
        for task in (self._probe, self._starting):
            if task is not None and not task.done():
                task.cancel()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch, self._watch_at = None, math.inf
        while (conn := self._take_parked()) is not None:
            self._later(self._return(conn, CLEANUP_TIMEOUT))
        if self._background:
            # connections on their way back to the pool
            await asyncio.wait(list(self._background), timeout=ADMIN_TIMEOUT)
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            if pool.get_size() > pool.get_idle_size():
                # Waiters still queued on the server: ending their sessions
                # ends their waits (they get BackendUnavailable).
                pool.terminate()
                return
            try:
                await asyncio.wait_for(pool.close(), timeout=ADMIN_TIMEOUT)
            except Exception:  # noqa: BLE001 - a silent server: drop the sockets
                pool.terminate()

    # -- connections ------------------------------------------------------------

    async def _checkout(self, bound: float) -> Any:
        """A connection from the pool by ``bound``.

        A connection kept after a release (``_park``) is taken as it is. With
        a connection this backend gave back to the pool it is a plain
        ``acquire`` (no I/O as a rule; asyncpg puts a holder back when an
        acquire is cancelled). Otherwise the checkout, which may connect,
        runs in its own task: a caller that gives up (cancelled, out
        of time) leaves it to finish, and a connection it brings back goes
        straight back to the pool, so no half-made connection is left behind.
        """
        pool = self._pool
        conn = self._take_parked()
        if conn is not None:
            return conn
        if self._warm > 0:
            self._warm -= 1
            with self._edge:
                return await pool.acquire()
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = loop.create_task(_acquire_from(pool))
        try:
            try:
                async with self._edge, asyncio.timeout_at(bound):
                    return await asyncio.shield(task)
            except BackendUnavailable as exc:
                if not isinstance(exc.__cause__, TimeoutError):
                    raise
                # (asyncpg's connect timeout, or our bound: either way, say how long it took)
                raise BackendUnavailable(
                    f"PostgreSQL at {self._edge.address}: timed out after {loop.time() - started:.1f} s"
                    " getting a connection"
                ) from exc.__cause__
        except BaseException:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    self._later(pool.release(task.result()))
            else:
                task.add_done_callback(self._return_late_checkout)
            raise

    @contextlib.asynccontextmanager
    async def _borrow(self, within: float) -> AsyncIterator[Any]:
        """A pool connection for one short request, all of it bounded by ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        conn = await self._checkout(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                yield conn
        finally:
            # Back to the pool even if the caller is cancelled meanwhile; the
            # pool waits for a cancelled statement to be acknowledged (or
            # closes the connection).
            self._later(self._pool.release(conn, timeout=max(0.05, min(within, ADMIN_TIMEOUT))))

    def _return_late_checkout(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._later(self._pool.release(task.result()))

    def _later(self, coro: Any) -> None:
        """Run ``coro`` in the background, keeping a reference and swallowing its outcome."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_quiet)


class _PostgresShape:
    """The adapter of a fair lock, a read or write side, or a semaphore, on the backend's pool.

    Requests go through the backend (its pool, its lease connections, its
    holds); the adapter brings its own hooks, so a lost hold is reported to
    the waiters and holders of its own shape.
    """

    kind = "postgres"
    queues_waiters = True

    def __init__(self, backend: PostgresBackend, shape: Shape) -> None:
        self._backend = backend
        self._shape = shape
        self._hooks: BackendHooks | None = None

    def lock_key(self, name: str) -> str:
        high, low = self._backend._main_key(self._shape, name)
        if self._shape.kind == "semaphore":
            return f"pg_advisory_gate({high},{low})+{self._shape.permits} slots"
        return f"pg_advisory({high},{low})"

    def lease_time(self, ttl: float) -> float:
        return self._backend.lease_time(ttl)

    def primitive(self, shape: Shape) -> Backend:
        raise unsupported(self._backend.kind, shape, "ask the client's backend, not an adapter")

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        await self._backend._ready()

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        got = await self.wait_acquire(name, hold, ttl, 0.0)
        return Busy(None) if got is None else got

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None:
        return await self._backend._acquire(self._shape, self._hooks, name, hold, ttl, timeout)

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        return await self._backend.set_count(name, hold, count, ttl)

    async def release(self, name: str, hold: str) -> bool:
        return await self._backend.release(name, hold)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        return await self._backend.renew(items)

    async def subscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue (or a semaphore's head waiter) wakes waiters."""

    async def unsubscribe(self, name: str) -> None:
        """Nothing to do: the server's lock queue (or a semaphore's head waiter) wakes waiters."""

    async def info(self, name: str) -> LockInfo:
        return await self._backend._info(self._shape, name, self.lock_key(name))

    async def aclose(self) -> None:
        """Nothing of its own: the backend's ``aclose`` ends every hold and the pool."""


def _listening(attempt: _Attempt) -> tuple[str, Callable[..., None]] | None:
    """The (channel, callback) an attempt LISTENs with, if it does."""
    if attempt.notify is None or attempt.listener is None:
        return None
    return attempt.notify, attempt.listener


async def _no_reset(conn: Any) -> None:
    """Pool reset hook for asynclock's own pool: lease connections clean up after themselves."""


def _with_check_interval(init: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """The ``init`` of asynclock's own pool: client_connection_check_interval, once per connection."""

    async def setup(conn: Any) -> None:
        if conn.get_server_version().major >= 14:
            await conn.execute(f"SET client_connection_check_interval = {CHECK_INTERVAL_MS}")
        if init is not None:
            await init(conn)

    return setup


async def _acquire_from(pool: Any) -> Any:
    """``pool.acquire()`` as a coroutine (it returns an awaitable context object)."""
    return await pool.acquire()
