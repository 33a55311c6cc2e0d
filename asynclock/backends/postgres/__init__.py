"""PostgreSQL (``postgresql://``, ``postgres://``, or a given ``asyncpg.Pool``).

A hold is a *session-level advisory lock*; holds share a few sessions:

* An uncontended acquire is one statement on a session of the client's
  (``pg_try_advisory_lock`` with the fencing token, in the caller's task), a
  release one more: the round trips of a bare ``pg_advisory_lock`` and
  ``pg_advisory_unlock``. A client uses at most ``max_leases`` sessions
  (default 3) for any number of holds, opened as its requests need them
  (``_sessions``); the client keeps its holds of one key apart itself, since
  a session may always lock again what it holds (``_hold``).
* Waiting costs no connection: a waiter's row goes in an UNLOGGED FIFO
  queue table, its client's one listening session (``_listener``) hears
  when to try again, and a release wakes only the first waiter
  (``_queue``). A newcomer, even with ``timeout=0``, does not jump the
  queue.
* The lease is the session. Each runs with ``idle_session_timeout`` at
  least the ttl of its holds (PostgreSQL 14+), so a client that hangs or is
  cut off loses its sessions, and their locks, a ttl after its last ping;
  the watchdog pings each session (not each hold) every ttl/3, and a hold's
  trusted deadline (ping send time + ttl - drift) ends before the server
  could end the session. A session that closes (``pg_terminate_backend``,
  server restart, network) loses exactly its holds, at once.
* The fencing token comes from an UNLOGGED sequence in the statement that
  takes the lock (PostgreSQL 15+; on older servers, a per-name counter row): see
  ``_tokens`` for how tokens keep increasing across a crash.
* Names map to keys in the two-int advisory space (see ``_keys``). Two names
  whose keys collide share one lock: that can only add exclusion, never
  remove it. ``info`` tells colliding names apart by asking the holders'
  clients (``_inspect``).
* Re-entry is counted in the client; the server holds the lock once per
  client and key.

More primitives, on the same sessions and the same queue:

* The fair lock is the plain lock itself (same key, same tokens): the queue
  is FIFO already.
* A read-write lock takes its own key: readers shared (the read holds of
  one client share its one shared lock), the writer exclusive. A waiting
  writer keeps newcomers out, readers too: it is in the queue.
* A semaphore is N slot keys and a gate key its waiters queue on (see
  ``_semaphore``).
* A leader election is a lock of a key of its own, queued FIFO like the
  fair lock; the leader writes its row in ``<table>_leaders`` and every
  change is NOTIFYed on the election's channel (see ``_election``).

Connections: with a URL asynclock opens its own pool, ``max_leases``
sessions for holds plus the listening one, so held locks never take
connections from the application. With a given pool, it borrows at most
``max_leases`` (default: half of the pool's ``max_size``, at most 3) plus
the listening one, gives them back clean, and never closes the pool. A
session without holds goes back to the pool after ``PARK_TIME``. Session
locks need a real session: do not put a transaction-pooling PgBouncer
between asynclock and PostgreSQL.

Errors: see ``_errors``. What it does not survive: advisory locks live in
the primary's memory and are not replicated. After a failover the new
primary knows no locks, while a holder still connected to an old primary
that keeps running believes it holds its lock. Its tokens start from its own
clock (the sequence comes up reset there): they keep increasing if the two
servers' clocks agree to within the failover's duration. Use it on one
primary (or accept that a failover is a window where only your own fencing
checks help).
"""

from __future__ import annotations

try:
    import asyncpg  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'asynclock[postgres]'") from exc

from ._backend import DEFAULT_MAX_LEASES, PostgresBackend
from ._config import DSN_PARAMETERS, OWN_OPTIONS
from ._keys import advisory_key, election_key, gate_key, marker_key, name_check, permits_key, rw_key, slot_key
from ._sessions import PARK_TIME
from ._tokens import FLOOR

__all__ = [
    "DEFAULT_MAX_LEASES",
    "DSN_PARAMETERS",
    "FLOOR",
    "OWN_OPTIONS",
    "PARK_TIME",
    "PostgresBackend",
    "advisory_key",
    "election_key",
    "gate_key",
    "marker_key",
    "name_check",
    "permits_key",
    "rw_key",
    "slot_key",
]

PostgresBackend.__module__ = __name__
