"""PostgreSQL (``postgresql://``, ``postgres://``, or a given ``asyncpg.Pool``).

A hold is a *session-level advisory lock* on a connection kept for the whole
lease, one connection per hold:

* An acquire first *tries* (``pg_try_advisory_lock``), taking the lock, the
  fencing token and the hold's session settings in one statement, one round
  trip, in the caller's task. Only when that fails does it wait, in the
  server's own lock queue (``pg_advisory_lock`` bounded by ``lock_timeout``),
  so nobody polls; ``timeout=0`` is the try alone. The try cannot jump that
  queue: the server hands a released lock to the head waiter inside the
  release itself, and a request that conflicts with a queued one is refused.
  A waiter the caller cancels is cancelled on the server too (asyncpg sends
  a CancelRequest); its release by identity then unlocks whatever the
  cancelled statement got before the connection goes back to the pool, and
  a connection that cannot be brought back to a known state in time is
  closed (its session, and so its locks, end with it). Connections run with
  ``client_connection_check_interval`` (PostgreSQL 14+; set once per
  connection of asynclock's own pool, per wait on a given pool), so the
  waiter of a client that crashed or closed its connection leaves the queue
  instead of waiting on as a ghost. While anybody waits the server is probed
  every ttl on another connection, so a server that went silent ends the
  waits with ``BackendUnavailable``.
* The lease is the connection. Each lease connection runs with
  ``idle_session_timeout`` = ttl (PostgreSQL 14+), so a holder that hangs or is
  cut off loses its session, and its locks, a ttl after its last ping; the
  watchdog pings every ttl/3, and the client's trusted deadline (ping send
  time + ttl - drift) ends before the server could end the session. A
  connection that closes (``pg_terminate_backend``, server restart, network)
  loses its holds at once, through asyncpg's termination listener.
* The fencing token is a per-name counter in the table ``<prefix>_fence``
  (``table=`` to choose another, ``schema.table`` allowed), created when
  missing; see ``_tokens`` for how it survives a crash.
* Names map to keys in the two-int advisory space (see ``_keys``). Two names
  whose keys collide share one lock: that can only add exclusion (a hold of
  either name keeps the other out), never remove it, because a session lock
  is exclusive per key and each hold has its own session. ``info`` tells
  colliding names apart through a second, independent digest of the name
  carried in the holder's ``application_name``.
* Re-entry is counted in the client; the server holds the lock once per hold.

More primitives, on the same connections and the same lock manager:

* The fair lock is the plain lock itself (same key, same token counter):
  PostgreSQL grants advisory locks in queue order already.
* A read-write lock takes its own key: readers
  ``pg_advisory_lock_shared``, the writer ``pg_advisory_lock``. The server
  queues a new shared request behind a waiting exclusive one, so writers are
  not starved. Reads and writes share one token counter.
* A semaphore is N slot keys and a gate (see ``_semaphore``).

Connections: with a URL asynclock opens its own pool, ``max_leases`` (default
50) connections for holds and waiters plus one for ``info`` and probes, so
held locks never take connections from the application. With a given pool,
holds and waiters borrow from it, at most ``max_leases`` at a time (default:
half of the pool's ``max_size``) so the application keeps the rest; the pool
is not closed by asynclock. Either way every held *or waiting* lock costs one
server connection (a backend process) for as long as it is held or waited
for, because a blocking wait occupies its session and the death of a shared
session would take every lock on it. A lease connection of asynclock's own
pool, clean after its release, stays with the backend for half a second
(four at most) before it goes back to the pool, so a lock taken again at
once needs no pool hand-over. Session locks need a real session: do not put
a transaction-pooling PgBouncer between asynclock and PostgreSQL.

Errors: see ``_errors``. What it does not survive: advisory locks live in
the primary's memory and are not replicated. After a failover the new
primary knows no locks, while a holder still connected to an old primary
that keeps running believes it holds its lock. Its tokens start from its own
clock (the counter table is unlogged, so it comes up empty there): they keep
increasing if the two servers' clocks agree to within the failover's
duration. Use it on one primary (or accept that a failover is a window where
only your own fencing checks help).
"""

from __future__ import annotations

try:
    import asyncpg  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'asynclock[postgres]'") from exc

from ._backend import DEFAULT_MAX_LEASES, PostgresBackend
from ._config import DSN_PARAMETERS, OWN_OPTIONS
from ._connections import PARK_MAX, PARK_TIME
from ._keys import advisory_key, gate_key, name_check, permits_key, rw_key, slot_key

__all__ = [
    "DEFAULT_MAX_LEASES",
    "DSN_PARAMETERS",
    "OWN_OPTIONS",
    "PARK_MAX",
    "PARK_TIME",
    "PostgresBackend",
    "advisory_key",
    "gate_key",
    "name_check",
    "permits_key",
    "rw_key",
    "slot_key",
]

PostgresBackend.__module__ = __name__
