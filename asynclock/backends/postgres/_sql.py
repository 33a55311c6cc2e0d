"""Every statement the backend sends on a hold's or a waiter's behalf, each with its ``$n`` contract.

Names a statement cannot take as parameters are filled in once per backend
by :class:`Statements`: ``{table}`` the fence table, ``{queue}`` the queue
table, and the token: ``{token}`` is ``nextval`` of the token sequence
(PostgreSQL 15+), while on older servers a ``fence`` CTE increments the
name's counter row and ``{token}`` reads it (see ``_tokens``).

Conventions: a key is two int4 parameters; a lock statement takes the lock
first and evaluates the rest only when it was granted (``MATERIALIZED`` CTEs
run once and in order; ``CASE`` evaluates only the branch it needs); a
*marker* is a key's :func:`~._keys.marker_key`, held shared by every
listening session with waiters queued for the key, so that taking it
exclusively for the statement's instant (``pg_try_advisory_xact_lock``)
says whether anybody waits. A queue row is *live* while its listening
session holds the row's session key (the shared xact try fails).
"""

from __future__ import annotations

__all__ = ["LIVE", "Statements", "next_token"]

#: A queue row ``q`` is live: its listening session holds its key. The
#: session running the statement may pass its own key as $LS1, $LS2 (it sees
#: no conflict with its own lock), NULL otherwise.
LIVE = "((q.s1 = {ls1} AND q.s2 = {ls2}) OR NOT pg_try_advisory_xact_lock_shared(q.s1, q.s2))"

_TRY_KEY = (
    "CASE WHEN $5 THEN pg_try_advisory_lock_shared($1::int4, $2::int4)"
    " ELSE pg_try_advisory_lock($1::int4, $2::int4) END"
)
_UNLOCK_KEY = (
    "CASE WHEN $5 THEN pg_advisory_unlock_shared($1::int4, $2::int4) ELSE pg_advisory_unlock($1::int4, $2::int4) END"
)

#: The fast try of a lock or of a read-write side, on a name already registered (token sequence).
#: $1, $2 key; $3, $4 its marker; $5 shared (bool). Returns one int8: the token (held now),
#: 0 (somebody else holds it), or -1 (it was free but waiters are queued: let go again).
TRY = f"""
    SELECT CASE WHEN NOT {_TRY_KEY} THEN 0::int8
                WHEN pg_try_advisory_xact_lock($3::int4, $4::int4) THEN {{token}}
                WHEN {_UNLOCK_KEY} THEN -1::int8
                ELSE -1::int8 END
"""

#: TRY that also writes the name's fence row: the first hold of a name by this
#: backend registers it (``names()``), or (token table) counts its token.
#: $1-$5 as TRY; $6 fence row (bytea); $7 lock_timeout (ms, text: only a fence
#: row another transaction holds can make it wait). Returns the same int8.
TRY_WRITE = f"""
    WITH got AS MATERIALIZED (
        SELECT set_config('lock_timeout', $7, true) AS lt, {_TRY_KEY} AS ok
    ), open AS MATERIALIZED (
        SELECT ok, CASE WHEN ok THEN pg_try_advisory_xact_lock($3::int4, $4::int4) ELSE false END AS free FROM got
    ), back AS MATERIALIZED (
        SELECT {_UNLOCK_KEY} AS done FROM open WHERE ok AND NOT free
    ), {{fence_from_open}}
    SELECT CASE WHEN NOT open.ok THEN 0::int8 WHEN NOT open.free THEN -1::int8 ELSE {{token}} END,
           (SELECT count(*) FROM back) AS backed
    FROM open
"""

#: A read hold joining its client's read hold of the same key (one shared lock per client):
#: only the marker check and a token from the sequence. $1, $2 the marker. Returns one int8:
#: the token, or -1 (waiters are queued: a writer may be among them).
JOIN = "SELECT CASE WHEN pg_try_advisory_xact_lock($1::int4, $2::int4) THEN {token} ELSE -1::int8 END"

#: JOIN on the token table. $1, $2 key; $3, $4 marker; $5 fence row; $6 lock_timeout.
JOIN_WRITE = """
    WITH open AS MATERIALIZED (
        SELECT set_config('lock_timeout', $6, true) AS lt, pg_try_advisory_xact_lock($3::int4, $4::int4) AS free
    ), {fence_from_open_join}
    SELECT CASE WHEN open.free THEN {token} ELSE -1::int8 END FROM open
"""

#: Release a lock or read-write side (or a semaphore's slot) and say whether anybody waits.
#: $1, $2 key; $3 shared; $4, $5 the marker to look at. Returns int: bit 0 the lock was
#: held, bit 1 waiters are queued (then the releaser sends WAKE: a statement of its own,
#: whose snapshot sees every queue row committed before this unlock).
RELEASE = """
    SELECT CASE WHEN CASE WHEN $3 THEN pg_advisory_unlock_shared($1::int4, $2::int4)
                          ELSE pg_advisory_unlock($1::int4, $2::int4) END
                THEN CASE WHEN pg_try_advisory_xact_lock($4::int4, $5::int4) THEN 1 ELSE 3 END
                ELSE CASE WHEN pg_try_advisory_xact_lock($4::int4, $5::int4) THEN 0 ELSE 2 END END
"""

#: Tell the first live waiter queued for a key to try (NOTIFY its backend's channel).
#: $1, $2 key; $3 a ticket to pass over (-1: none); $4, $5 the running session's own
#: session key (NULL: none). Returns int: how many were told (0 or 1).
WAKE = f"""
    SELECT count(pg_notify('asynclock_' || h.client, 't ' || h.hold))::int FROM (
        SELECT q.client, q.hold FROM {{queue}} q
        WHERE q.k1 = $1 AND q.k2 = $2 AND q.ticket <> $3 AND {LIVE.format(ls1="$4", ls2="$5")}
        ORDER BY q.ticket LIMIT 1) h
"""

#: Queue a waiter (on its listening session, which holds the key's marker already).
#: $1, $2 key; $3 shared; $4 hold id; $5 backend id (its channel); $6, $7 session key.
#: Returns the ticket: the queue's order.
ENQUEUE = """
    INSERT INTO {queue} (k1, k2, shared, hold, client, s1, s2) VALUES ($1, $2, $3, $4, $5, $6, $7)
    RETURNING ticket
"""

#: Leave the queue (a waiter that timed out or was cancelled), and tell the first live waiter
#: left to try in its place. $1 ticket; $2, $3 key; $4, $5 the running session's session key.
#: Returns int: how many were told.
LEAVE = f"""
    WITH gone AS (DELETE FROM {{queue}} WHERE ticket = $1)
    SELECT count(pg_notify('asynclock_' || h.client, 't ' || h.hold))::int FROM (
        SELECT q.client, q.hold FROM {{queue}} q
        WHERE q.k1 = $2 AND q.k2 = $3 AND q.ticket <> $1 AND {LIVE.format(ls1="$4", ls2="$5")}
        ORDER BY q.ticket LIMIT 1) h
"""

#: A queued waiter's try: granted only to the first live row, then its row (and the dead
#: ones before it) goes, and the next live waiter is told it is first ('h'), or to try
#: at once ('t') when both are read holds. $1, $2 key; $3 ticket; $4 shared; $5 take the
#: lock (false: the client holds it shared already, the hold joins); $6 fence row;
#: $7 lock_timeout. Returns (ok, head, present, token): present is false when the row is
#: gone (its listening session ended): the waiter queues again.
HEAD = f"""
    WITH first AS MATERIALIZED (
        SELECT q.ticket FROM {{queue}} q
        WHERE q.k1 = $1 AND q.k2 = $2 AND {LIVE.format(ls1="NULL", ls2="NULL")}
        ORDER BY q.ticket LIMIT 1
    ), got AS MATERIALIZED (
        SELECT set_config('lock_timeout', $7, true) AS lt,
               coalesce((SELECT ticket FROM first) = $3, false) AS head,
               CASE WHEN (SELECT ticket FROM first) = $3 THEN
                    CASE WHEN NOT $5 THEN true
                         WHEN $4 THEN pg_try_advisory_lock_shared($1::int4, $2::int4)
                         ELSE pg_try_advisory_lock($1::int4, $2::int4) END
               ELSE false END AS ok,
               EXISTS (SELECT 1 FROM {{queue}} q WHERE q.ticket = $3) AS present
    ), open AS MATERIALIZED (
        SELECT ok AS free FROM got
    ), gone AS (
        DELETE FROM {{queue}} q USING got WHERE got.ok AND q.k1 = $1 AND q.k2 = $2 AND q.ticket <= $3
    ), told AS MATERIALIZED (
        SELECT pg_notify('asynclock_' || n.client, CASE WHEN $4 AND n.shared THEN 't ' ELSE 'h ' END || n.hold)
        FROM got, LATERAL (
            SELECT q.client, q.hold, q.shared FROM {{queue}} q
            WHERE q.k1 = $1 AND q.k2 = $2 AND q.ticket > $3 AND {LIVE.format(ls1="NULL", ls2="NULL")}
            ORDER BY q.ticket LIMIT 1) n
        WHERE got.ok
    ), {{fence_from_open}}
    SELECT got.ok, got.head, got.present, CASE WHEN got.ok THEN {{token}} END AS token,
           (SELECT count(*) FROM told) AS told
    FROM got
"""

#: Waiters queued for a key, live ones only. $1, $2 key; $3, $4 the running session's
#: session key. Returns (count).
QUEUED = f"SELECT count(*) FROM {{queue}} q WHERE q.k1 = $1 AND q.k2 = $2 AND {LIVE.format(ls1='$3', ls2='$4')}"

#: Take (or let go of) markers and permits keys, shared, on the listening session.
#: $1, $2 the keys (int4[] each). Returns (count).
MARK = "SELECT count(pg_advisory_lock_shared(t.k1, t.k2)) FROM unnest($1::int4[], $2::int4[]) AS t(k1, k2)"
UNMARK = "SELECT count(pg_advisory_unlock_shared(t.k1, t.k2)) FROM unnest($1::int4[], $2::int4[]) AS t(k1, k2)"

# -- fence fragments: a CTE ``fence`` after ``open`` (one row, ``free``: granted) --------

#: Token sequence: the name's row is written once (it registers the name for names()).
#: (In JOIN, $5 is the fence row, else $6.)
_REGISTER = (
    "fence AS (INSERT INTO {table} (name, k1, k2, value) SELECT ${row}::bytea, $1, $2, 0 FROM open"
    " WHERE open.free ON CONFLICT (name) DO NOTHING)"
)
#: Token table: the name's counter, one above its last value (see _tokens for the first).
_COUNT = (
    "fence AS (INSERT INTO {table} AS f (name, k1, k2, value) SELECT ${row}::bytea, $1, $2, {first} FROM open"
    " WHERE open.free ON CONFLICT (name) DO UPDATE SET value = f.value + 1, k1 = EXCLUDED.k1, k2 = EXCLUDED.k2"
    " RETURNING f.value)"
)

#: Round trips that prove a session alive, and the server's version. No parameters.
PING = "SELECT 1"
SERVER_VERSION = "SELECT current_setting('server_version_num')"

#: A new session of asynclock: its application_name and idle_session_timeout (ms, NULL
#: where the server has none). $1 application_name; $2 idle. Returns nothing useful.
SET_UP_SESSION = (
    "SELECT set_config('application_name', $1, false),"
    " CASE WHEN $2::text IS NOT NULL THEN set_config('idle_session_timeout', $2, false) END"
)
#: Raise a session's idle_session_timeout (a hold with a longer ttl came). $1 ms.
SET_IDLE = "SELECT set_config('idle_session_timeout', $1, false)"
#: A listening session: its application_name, its session key (held for its life), and a
#: bound on its waits for a marker. $1 application_name; $2, $3 session key; $4 lock_timeout.
SET_UP_LISTENER = (
    "SELECT set_config('application_name', $1, false), set_config('lock_timeout', $4, false),"
    " pg_try_advisory_lock($2::int4, $3::int4)"
)

#: A connection given back to a pool: nothing of asynclock's left on it (simple protocol,
#: one round trip, no parameters).
GIVE_BACK = (
    "SELECT pg_advisory_unlock_all(); UNLISTEN *; RESET application_name; RESET lock_timeout;"
    " RESET idle_session_timeout"
)
GIVE_BACK_PG13 = "SELECT pg_advisory_unlock_all(); UNLISTEN *; RESET application_name; RESET lock_timeout"

#: The two-int advisory locks this session holds (after a request cut short, whose effect
#: is unknown). Returns (k1, k2, shared) rows, keys as signed int4.
MINE = """
    SELECT l.classid::int8::bit(32)::int4 AS k1, l.objid::int8::bit(32)::int4 AS k2, l.mode = 'ShareLock' AS shared
    FROM pg_locks l
    WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
"""
#: Let go of one lock. $1, $2 key; $3 shared.
UNLOCK = (
    "SELECT CASE WHEN $3 THEN pg_advisory_unlock_shared($1::int4, $2::int4)"
    " ELSE pg_advisory_unlock($1::int4, $2::int4) END"
)

#: Granted and waiting advisory locks on a main key or a set of keys, in this
#: database, with their holders' application_name. pg_locks shows a two-int
#: key as unsigned oids, objsubid 2. $1, $2 the main key (unsigned, int8);
#: $3, $4 other keys (int8[] each). Returns (pid, granted, mode, app, main).
LOCKS_ON = """
    SELECT l.pid, l.granted, l.mode, a.application_name AS app,
           l.classid::int8 = $1 AND l.objid::int8 = $2 AS main
    FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((l.classid::int8 = $1 AND l.objid::int8 = $2)
           OR (l.classid::int8, l.objid::int8) IN (SELECT * FROM unnest($3::int8[], $4::int8[])))
    ORDER BY l.pid
"""

#: Names of the plain locks held now (rows of other primitives start with a
#: 0xff byte). No parameters. Returns (name).
HELD_NAMES = """
    SELECT f.name FROM {table} f
    WHERE f.name < '\\xff'::bytea AND EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
          AND l.classid::int8 = (f.k1::int8 & 4294967295) AND l.objid::int8 = (f.k2::int8 & 4294967295)
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    )
    ORDER BY f.name
"""

#: Delete a queue row (one of a listening session that ended: dead already). $1 ticket.
DELETE_ROW = "DELETE FROM {queue} WHERE ticket = $1"


def next_token(sequence: str) -> str:
    """The SQL expression of the next token from ``sequence`` (a quoted name)."""
    return "nextval('" + sequence.replace("'", "''") + "'::regclass)"


class Statements:
    """The statements of one backend, with its tables' names and its token source filled in."""

    __slots__ = (
        "delete_row",
        "enqueue",
        "head",
        "held_names",
        "join",
        "join_write",
        "leave",
        "queue",
        "queued",
        "release",
        "try_lock",
        "try_write",
        "wake",
    )

    def __init__(self, table: str, queue: str, sequence: str | None, first_token: str) -> None:
        """``table``, ``queue``, ``sequence``: quoted names; ``sequence`` None: tokens from the table."""
        self.queue = queue
        if sequence is not None:
            token = next_token(sequence)
            fence, fence_join = _REGISTER.format(table=table, row=6), _REGISTER.format(table=table, row=5)
        else:
            token = "(SELECT value FROM fence)"
            fence = _COUNT.format(table=table, row=6, first=first_token)
            fence_join = _COUNT.format(table=table, row=5, first=first_token)
        fill = {"token": token, "queue": queue, "fence_from_open": fence, "fence_from_open_join": fence_join}
        #: The fast try without a write (token sequence, a name registered already); None: always TRY_WRITE.
        self.try_lock = TRY.format(**fill) if sequence is not None else None
        self.try_write = TRY_WRITE.format(**fill)
        # A join on a sequence needs no write: its group's first hold registered the name.
        self.join = JOIN.format(**fill) if sequence is not None else None
        self.join_write = JOIN_WRITE.format(**fill)
        self.head = HEAD.format(**fill)
        self.release = RELEASE
        self.wake = WAKE.format(queue=queue)
        self.enqueue = ENQUEUE.format(queue=queue)
        self.leave = LEAVE.format(queue=queue)
        self.queued = QUEUED.format(queue=queue)
        self.held_names = HELD_NAMES.format(table=table)
        self.delete_row = DELETE_ROW.format(queue=queue)
