"""Every statement the backend sends, each with its ``$n`` contract: the set-up's, the
holds' and waiters' (locks, read-write locks, semaphores, elections), and ``info``'s.

Names a statement cannot take as parameters are filled in once per backend
by :class:`Statements`: ``{table}`` the fence table, ``{queue}`` the queue
table, ``{leaders}`` the leaders table, and the token: ``{token}`` is
``nextval`` of the token sequence (PostgreSQL 15+), while on older servers a
``fence`` CTE increments the name's counter row and ``{token}`` reads it
(see ``_tokens``).

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

from ._keys import EPOCH_ROW

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


#: Send one payload to several channels (``info``'s questions and answers). $1 channels
#: (text[]); $2 payload. Returns (count).
NOTIFY_EACH = "SELECT count(pg_notify(c, $2)) FROM unnest($1::text[]) AS c"

# -- semaphores: N slot keys, waiters queued on the gate key (see ``_semaphore``) ----------

# The slots this client does not hold, tried in order, the first free one taken.
# $3, $4: their keys (int4[] each).
_SLOT = """slot AS MATERIALIZED (
        SELECT t.k1, t.k2 FROM {source}, unnest($3::int4[], $4::int4[]) AS t(k1, k2)
        WHERE {cond} AND pg_try_advisory_lock(t.k1, t.k2) LIMIT 1
    ), known AS MATERIALIZED (
        SELECT r.k1, r.k2 FROM {table} r WHERE r.name = $5::bytea
    ), """

# The fence row: token sequence (written once, with the permits of its first holder), or
# token table (its counter; the permits with a new row). $5 fence row; $6 permits.
_FENCE_SEQUENCE = """fence AS (
        INSERT INTO {table} (name, k1, k2, value) SELECT $5::bytea, $6, -1, 0 FROM slot
        WHERE NOT EXISTS (SELECT 1 FROM known) ON CONFLICT (name) DO NOTHING RETURNING k1, k2, 0::int8 AS value
    )"""
_FENCE_TABLE = """fence AS (
        INSERT INTO {table} AS f (name, k1, k2, value) SELECT $5::bytea, $6, -1, {first} FROM slot
        ON CONFLICT (name) DO UPDATE SET value = f.value + 1 RETURNING f.k1, f.k2, f.value
    )"""

# (permits, mark): what the fence row records; NULL when a row made by another client
# at this very moment is not visible yet (the permits check then reads it).
_RESULT = """(SELECT k1 FROM slot) AS k1, (SELECT k2 FROM slot) AS k2,
           CASE WHEN EXISTS (SELECT 1 FROM slot) THEN {token} END AS token,
           coalesce((SELECT k1 FROM fence), (SELECT k1 FROM known)) AS permits,
           coalesce((SELECT k2 FROM fence), (SELECT k2 FROM known)) AS mark"""

#: A newcomer's try. $1, $2 the gate's marker; $3, $4 slot keys; $5 fence row; $6 permits;
#: $7 lock_timeout. Returns (quiet, k1, k2, token, permits, mark): quiet false when
#: waiters are queued (no slot was tried), k1, k2 the slot taken (NULL: none free).
TRY_SLOT = (
    """
    WITH open AS MATERIALIZED (
        SELECT set_config('lock_timeout', $7, true) AS lt, pg_try_advisory_xact_lock($1::int4, $2::int4) AS quiet
    ), """
    + _SLOT.format(source="open", cond="open.quiet", table="{table}")
    + "{fence}\n    SELECT (SELECT quiet FROM open) AS quiet, "
    + _RESULT
)

#: A queued waiter's try: a slot only for the first live row, then its row (and the dead ones
#: before it) goes and the next live waiter is told to try too. $1, $2 the gate key; $3, $4
#: slot keys; $5 fence row; $6 permits; $7 lock_timeout; $8 ticket.
#: Returns (head, present, told, k1, k2, token, permits, mark).
HEAD_SLOT = (
    """
    WITH first AS MATERIALIZED (
        SELECT q.ticket FROM {queue} q WHERE q.k1 = $1 AND q.k2 = $2 AND """
    + LIVE.format(ls1="NULL", ls2="NULL")
    + """
        ORDER BY q.ticket LIMIT 1
    ), got AS MATERIALIZED (
        SELECT set_config('lock_timeout', $7, true) AS lt, coalesce((SELECT ticket FROM first) = $8, false) AS head,
               EXISTS (SELECT 1 FROM {queue} q WHERE q.ticket = $8) AS present
    ), """
    + _SLOT.format(source="got", cond="got.head", table="{table}")
    + """gone AS (
        DELETE FROM {queue} q WHERE EXISTS (SELECT 1 FROM slot) AND q.k1 = $1 AND q.k2 = $2 AND q.ticket <= $8
    ), told AS MATERIALIZED (
        SELECT pg_notify('asynclock_' || n.client, 't ' || n.hold) FROM slot, LATERAL (
            SELECT q.client, q.hold FROM {queue} q
            WHERE q.k1 = $1 AND q.k2 = $2 AND q.ticket > $8 AND """
    + LIVE.format(ls1="NULL", ls2="NULL")
    + """
            ORDER BY q.ticket LIMIT 1) n
    ), {fence}
    SELECT got.head, got.present, (SELECT count(*) FROM told) AS told, """
    + _RESULT
    + "\n    FROM got"
)

#: The permits a semaphore's fence row $1 records, locked for the transaction.
#: Returns (k1, k2): the permits, and the mark (-1, _keys.PERMITS_MARK) that says k1 is permits.
PERMITS_ROW = "SELECT k1, k2 FROM {table} WHERE name = $1 FOR UPDATE"
#: Record $2 as the permits of the semaphore whose fence row is $1. Returns nothing.
RECORD_PERMITS = "UPDATE {table} SET k1 = $2, k2 = -1 WHERE name = $1"
#: Whether permits_key $1, $2 is held by anybody (tried exclusively and let go).
#: Returns one bool.
PERMITS_IN_USE = (
    "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4)"
    " THEN NOT pg_advisory_unlock($1::int4, $2::int4) ELSE true END"
)

# -- elections: the leaders table and its rows (see ``_election``) --------------------------

#: The leaders table. The key (k1, k2) is the election's advisory key; (t1, t2) the term key.
#: No parameters.
CREATE_LEADERS = (
    "CREATE UNLOGGED TABLE {leaders} (k1 int4 NOT NULL, k2 int4 NOT NULL, name text NOT NULL,"
    " identity text NOT NULL, token int8 NOT NULL, since timestamptz NOT NULL, ttl float8 NOT NULL,"
    " t1 int4 NOT NULL, t2 int4 NOT NULL, PRIMARY KEY (k1, k2))"
)

#: The new leader's row and its term key, on the session that holds the election's key, and the
#: election's notification. $1, $2 election key; $3 name; $4 identity; $5 token; $6 ttl; $7, $8 term
#: key; $9 channel; $10 lock_timeout (ms, text: only a row lock of a statement in flight can make
#: it wait). Returns (written, term key taken).
ANNOUNCE = """
    WITH term AS MATERIALIZED (
        SELECT set_config('lock_timeout', $10, true) AS lt, pg_try_advisory_lock($7::int4, $8::int4) AS ok
    ), up AS (
        INSERT INTO {leaders} AS r (k1, k2, name, identity, token, since, ttl, t1, t2)
        SELECT $1, $2, $3, $4, $5, clock_timestamp(), $6, $7, $8 FROM term
        ON CONFLICT (k1, k2) DO UPDATE SET name = EXCLUDED.name, identity = EXCLUDED.identity,
            token = EXCLUDED.token, since = EXCLUDED.since, ttl = EXCLUDED.ttl, t1 = EXCLUDED.t1, t2 = EXCLUDED.t2
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM up)::int AS written, (SELECT ok FROM term) AS term, pg_notify($9, 'leader')
"""

#: A resign: the leader's row (of its token only: a later leader's stays), its term key, the
#: notification; the election's key is let go of by the lock's release after it, which wakes
#: the first live candidate in line. With one in line the notification says so ('next <s>': the
#: next leader's row comes with a notification of its own, look anyway after s seconds), so
#: observers see one change, to the next leader; else 'gone'. $1, $2 election key; $3 token;
#: $4, $5 term key; $6 channel; $7 the seconds (text). Returns (deleted).
RETIRE = f"""
    WITH gone AS (DELETE FROM {{leaders}} WHERE k1 = $1 AND k2 = $2 AND token = $3 RETURNING 1)
    SELECT (SELECT count(*) FROM gone)::int, pg_advisory_unlock($4::int4, $5::int4),
           pg_notify($6, CASE WHEN EXISTS (
               SELECT 1 FROM {{queue}} q WHERE q.k1 = $1 AND q.k2 = $2 AND {LIVE.format(ls1="NULL", ls2="NULL")}
           ) THEN 'next ' || $7::text ELSE 'gone' END)
"""

#: The row of an election, whether it is live (one session holds its term key and the
#: election's key), and the live candidates in line. $1, $2 election key; $3, $4 the running
#: session's session key. Returns (identity, token, since, ttl, live, waiting) or no row.
LEADER = f"""
    SELECT r.identity, r.token, extract(epoch FROM r.since)::float8 AS since, r.ttl,
           EXISTS (
               SELECT 1 FROM pg_locks t JOIN pg_locks e ON e.pid = t.pid
               WHERE t.locktype = 'advisory' AND t.objsubid = 2 AND t.granted AND t.mode = 'ExclusiveLock'
                 AND t.classid::int8 = (r.t1::int8 & 4294967295) AND t.objid::int8 = (r.t2::int8 & 4294967295)
                 AND e.locktype = 'advisory' AND e.objsubid = 2 AND e.granted AND e.mode = 'ExclusiveLock'
                 AND e.classid::int8 = (r.k1::int8 & 4294967295) AND e.objid::int8 = (r.k2::int8 & 4294967295)
                 AND t.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND e.database = t.database
           ) AS live,
           (SELECT count(*) FROM {{queue}} q
            WHERE q.k1 = $1 AND q.k2 = $2 AND {LIVE.format(ls1="$3", ls2="$4")})::int AS waiting
    FROM {{leaders}} r WHERE r.k1 = $1 AND r.k2 = $2
"""

#: A leader's client saw the session of its term end: observers look. $1 channel.
LOST = "SELECT pg_notify($1, 'lost')"

# -- the set-up: the schema objects and the token source (see ``_tokens``) --------------------

#: Whether a schema object exists. $1 its quoted name (text). Returns one bool.
EXISTS = "SELECT to_regclass($1) IS NOT NULL"
#: Make what ``create`` runs durable whatever the server's setting (in its transaction).
DURABLE = "SET LOCAL synchronous_commit = on"
#: The fence table, and its epoch row (there until a crash empties the table). No parameters.
CREATE_FENCE = (
    "CREATE UNLOGGED TABLE {table} (name bytea PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL, value bigint NOT NULL)"
)
EPOCH = "INSERT INTO {table} (name, k1, k2, value) VALUES ('\\x" + EPOCH_ROW.hex() + "'::bytea, 0, 0, 0)"
#: The queue table and its index (queue order per key). No parameters.
CREATE_QUEUE = (
    "CREATE UNLOGGED TABLE {queue} (ticket bigserial PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL,"
    " shared boolean NOT NULL, hold text NOT NULL, client text NOT NULL, s1 int4 NOT NULL, s2 int4 NOT NULL)"
)
QUEUE_INDEX = "CREATE INDEX ON {queue} (k1, k2, ticket)"
#: The token sequence (PostgreSQL 15+). No parameters.
CREATE_SEQUENCE = "CREATE UNLOGGED SEQUENCE {sequence}"

#: Token table: a name's first token, one above the epoch row's value (0), or
#: above the server time in µs when a crash has emptied the table (no epoch row).
#: An expression in the fence fragments, no parameters of its own.
FIRST_TOKEN = (
    "coalesce((SELECT e.value FROM {table} e WHERE e.name = '\\xff65706f636800'::bytea),"
    " (extract(epoch from clock_timestamp()) * 1000000)::int8) + 1"
)

#: Serialise the reseeding of the token sequence: a transaction-level advisory lock.
#: $1, $2 the seed key. Returns nothing useful.
SEED_LOCK = "SELECT pg_advisory_xact_lock($1::int4, $2::int4)"
#: Seed the sequence from the clock, above the table's counters, unless it is seeded.
#: $1 FLOOR. Run under SEED_LOCK. Returns the new value, or NULL (seeded already).
RESEED = (
    "SELECT CASE WHEN coalesce(pg_sequence_last_value('{seq}'::regclass), 0) < $1 THEN"
    " setval('{seq}'::regclass, greatest((extract(epoch from clock_timestamp()) * 1000000)::int8,"
    " (SELECT coalesce(max(f.value), 0) + 1 FROM {table} f)))"
    " END"
)
#: Draw a token from the sequence ({token}: ``next_token``). No parameters. Returns one int8.
DRAW = "SELECT {token}"


def next_token(sequence: str) -> str:
    """The SQL expression of the next token from ``sequence`` (a quoted name)."""
    return "nextval('" + sequence.replace("'", "''") + "'::regclass)"


class Statements:
    """The statements of one backend, with its tables' names and its token source filled in."""

    __slots__ = (
        "announce",
        "delete_row",
        "draw",
        "enqueue",
        "head",
        "head_slot",
        "held_names",
        "join",
        "join_write",
        "leader",
        "leave",
        "permits_row",
        "queued",
        "record_permits",
        "release",
        "reseed",
        "retire",
        "try_lock",
        "try_slot",
        "try_write",
        "wake",
    )

    def __init__(self, table: str, queue: str, sequence: str | None, leaders: str) -> None:
        """``table``, ``queue``, ``sequence``, ``leaders``: quoted names; ``sequence`` None: tokens from the table."""
        first = FIRST_TOKEN.format(table=table)
        if sequence is not None:
            token = next_token(sequence)
            fence, fence_join = _REGISTER.format(table=table, row=6), _REGISTER.format(table=table, row=5)
            slot_fence = _FENCE_SEQUENCE.format(table=table)
        else:
            token = "(SELECT value FROM fence)"
            fence = _COUNT.format(table=table, row=6, first=first)
            fence_join = _COUNT.format(table=table, row=5, first=first)
            slot_fence = _FENCE_TABLE.format(table=table, first=first)
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
        slot_fill = {"table": table, "queue": queue, "fence": slot_fence, "token": token}
        self.try_slot = TRY_SLOT.format(**slot_fill)
        self.head_slot = HEAD_SLOT.format(**slot_fill)
        self.permits_row = PERMITS_ROW.format(table=table)
        self.record_permits = RECORD_PERMITS.format(table=table)
        self.announce = ANNOUNCE.format(leaders=leaders)
        self.retire = RETIRE.format(leaders=leaders, queue=queue)
        self.leader = LEADER.format(leaders=leaders, queue=queue)
        #: The token sequence's reseeding and draw (None: tokens from the table).
        seq = None if sequence is None else sequence.replace("'", "''")
        self.reseed = None if seq is None else RESEED.format(seq=seq, table=table)
        self.draw = None if sequence is None else DRAW.format(token=token)
