"""MySQL and MariaDB (``mysql://``, ``mariadb://``): named locks (``GET_LOCK``) on a few shared sessions.

A hold is a *named lock* of a session; holds share a few sessions:

* An uncontended acquire is one statement on a session of the client's
  (``GET_LOCK`` with the fencing token, see ``_sql.TAKE``), a release one
  more (``RELEASE_LOCK``): the round trips of the bare pair. A client uses at
  most ``max_leases`` sessions (default 3) for any number of holds, opened
  as its requests need them (``_sessions``); the client keeps its holds of
  one key apart itself, since a session may always take again what it
  holds (``_hold``).
* Waiting is ``GET_LOCK`` itself, blocking in the server: one session per
  contended key per client waits there, for the client's whole line of
  waiters of that key, FIFO (``_lines``); a release wakes the next at once.
  A newcomer, even with ``timeout=0``, does not jump the line.
* The lease is the session. Each runs with a ``wait_timeout`` of at least
  the ttl of its holds (whole seconds, rounded up), so a client that hangs
  or is cut off loses its sessions, and their locks, that long after its
  last request; the watchdog pings each session (not each hold) every
  ttl/3, and a hold's trusted deadline (ping send time + ttl - drift) ends
  before the server could end the session. A session that closes (``KILL``,
  a server restart, the network) loses exactly its holds, found out at its
  next request (its next ping at the latest).
* The fencing token counts in the key's row of an InnoDB table, in the
  statement that takes the lock: tokens keep increasing across restarts of
  the server (``_sql``).
* Names map to keys (``_keys``): a plain lock's key is ``<prefix>:<name>``
  as it is when the server takes it (64 characters at most), so that other
  MySQL clients share the lock; longer (or unusual) names are hashed.
  ``info().key`` is the exact string.
* Re-entry is counted in the client; the server holds the lock once per
  client and key.

More primitives, on the same sessions: the fair lock is the plain lock itself
(the client's line and the server's queue are FIFO); a semaphore is N slot
keys (``_semaphore``); a leader election is a lock of a key of its own, with
the leader's row and a term key (``_election``). There is no read-write
lock: named locks have no shared mode.

Connections: asynclock opens its own (asyncmy), ``max_leases`` for holds
plus one per line of waiters and per observed election while they wait.
Session locks need a real session: do not put a proxy that multiplexes
sessions (ProxySQL's multiplexing, a transaction-pooling router) between
asynclock and the server. Named locks live in the server's memory and are
not replicated: after a failover the new primary knows no locks (its fence
rows come with replication, as far as it has caught up).
"""

from __future__ import annotations

try:
    import asyncmy  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the MySQL backend needs asyncmy: pip install 'asynclock[mysql]'") from exc

from ._backend import DEFAULT_MAX_LEASES, MySQLBackend
from ._config import CONNECT_OPTIONS, OWN_OPTIONS
from ._keys import MAX_KEY, election_key, lock_key, semaphore_key, slot_key, term_key
from ._lines import CHUNK
from ._sessions import PARK_TIME

__all__ = [
    "CHUNK",
    "CONNECT_OPTIONS",
    "DEFAULT_MAX_LEASES",
    "MAX_KEY",
    "OWN_OPTIONS",
    "PARK_TIME",
    "MySQLBackend",
    "election_key",
    "lock_key",
    "semaphore_key",
    "slot_key",
    "term_key",
]

MySQLBackend.__module__ = __name__
