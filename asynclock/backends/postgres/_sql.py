"""Every statement the backend sends, each with its ``$n`` contract.

``{table}`` stands for the fence table's quoted name (the one thing a
statement cannot take as a parameter); :class:`Statements` fills it in once
per backend. Millisecond settings travel as text (``set_config`` takes
text); ``idle`` parameters are NULL on servers before PostgreSQL 14, which
lack ``idle_session_timeout``.

The lock statements take the lock first and evaluate the rest only when it
was granted (``MATERIALIZED`` CTEs run once and in order; a select list is
evaluated left to right, so ``lock_timeout`` is set before a wait starts).
"""

from __future__ import annotations

__all__ = ["CLEANUP_PARTS", "Statements"]

# A name's first token: one above the epoch row's value (0), or, when a crash
# has emptied the table (no epoch row), above the server time in µs.
# (The epoch row's name is _keys.EPOCH_ROW, in hex.)
_FIRST_TOKEN = (
    "coalesce((SELECT e.value FROM {table} e WHERE e.name = '\\xff65706f636800'::bytea),"
    " (extract(epoch from clock_timestamp()) * 1000000)::int8) + 1"
)

# The session's own settings, read before a hold changes them, so that its
# release can put them back in the statement that unlocks.
_SETTINGS_BEFORE = "current_setting('application_name') AS app0, current_setting('idle_session_timeout', true) AS idle0"

# The lock statements after their ``got`` CTE (one row: ``ok``): the hold's
# session settings and the token, only if ``ok``.
# $1, $2 key; $3 fence row (bytea: a name may hold NUL, which text cannot);
# $4 application_name; $5 idle_session_timeout (ms, NULL: not set).
_GRANTED = (
    """
    cfg AS MATERIALIZED (
        SELECT """
    + _SETTINGS_BEFORE
    + """, set_config('application_name', $4, false) AS app,
               CASE WHEN $5::text IS NOT NULL THEN set_config('idle_session_timeout', $5, false) END AS idle
        FROM got WHERE ok
    ), fence AS (
        INSERT INTO {table} AS f (name, k1, k2, value)
        SELECT $3::bytea, $1, $2, """
    + _FIRST_TOKEN
    + """ FROM got WHERE ok
        ON CONFLICT (name) DO UPDATE SET value = f.value + 1, k1 = EXCLUDED.k1, k2 = EXCLUDED.k2
        RETURNING f.value
    )
    SELECT (SELECT ok FROM got) AS ok, (SELECT value FROM fence) AS token,
           (SELECT app0 FROM cfg) AS app0, (SELECT idle0 FROM cfg) AS idle0
"""
)

#: Try a lock, exclusive or shared, without waiting.
#: $1, $2 key; $3 fence row; $4 application_name; $5 idle_session_timeout;
#: $6 lock_timeout (ms; local to the statement: a try waits for nothing but a
#: fence row another transaction holds); $7 shared (bool).
#: Returns (ok, token, app0, idle0): app0/idle0 are the settings the grant replaced.
TRY_LOCK = (
    """
    WITH got AS MATERIALIZED (
        SELECT set_config('lock_timeout', $6, true) AS lt,
               CASE WHEN $7 THEN pg_try_advisory_lock_shared($1::int4, $2::int4)
                    ELSE pg_try_advisory_lock($1::int4, $2::int4) END AS ok
    ),"""
    + _GRANTED
)

#: Wait in the server's queue for a lock, exclusive or shared. Same contract as
#: TRY_LOCK; $6 lock_timeout bounds the wait ('0': no limit), and ends it
#: with lock_not_available.
WAIT_LOCK = (
    """
    WITH got AS MATERIALIZED (
        SELECT set_config('lock_timeout', $6, true) AS lt,
               CASE WHEN $7 THEN pg_advisory_lock_shared($1::int4, $2::int4) IS NOT NULL
                    ELSE pg_advisory_lock($1::int4, $2::int4) IS NOT NULL END AS ok
    ),"""
    + _GRANTED
)

# A semaphore's slot statements after their ``gate`` CTE (one row: ``open``).
# $1, $2 the gate key; $3, $4 the slot keys (int4[] each: their number is the
# permits); $5 fence row; $6 application_name; $7 idle_session_timeout; $8,
# $9 the permits key; $10 lock_timeout. The first free slot is locked; a hold
# takes the permits key shared; the fence row records the permits when it is
# made, and later only through the permits check.
_SLOT = (
    """
    slot AS MATERIALIZED (
        SELECT t.n FROM gate, unnest($3::int4[], $4::int4[]) WITH ORDINALITY AS t(k1, k2, n)
        WHERE CASE WHEN gate.open THEN pg_try_advisory_lock(t.k1, t.k2) ELSE false END
        LIMIT 1
    ), got AS MATERIALIZED (
        SELECT (SELECT n FROM slot) AS n, (SELECT open FROM gate) AS open
    ), shut AS MATERIALIZED (
        SELECT CASE WHEN $11 THEN pg_advisory_unlock($1::int4, $2::int4)
                    ELSE pg_advisory_unlock_shared($1::int4, $2::int4) END AS done
        FROM got WHERE CASE WHEN $11 THEN n IS NOT NULL ELSE open END
    ), cfg AS MATERIALIZED (
        SELECT """
    + _SETTINGS_BEFORE
    + """, set_config('application_name', $6, false) AS app,
               CASE WHEN $7::text IS NOT NULL THEN set_config('idle_session_timeout', $7, false) END AS idle,
               pg_advisory_lock_shared($8::int4, $9::int4) AS mine
        FROM got WHERE n IS NOT NULL
    ), fence AS (
        INSERT INTO {table} AS f (name, k1, k2, value)
        SELECT $5::bytea, cardinality($3::int4[]), -1, """
    + _FIRST_TOKEN
    + """ FROM got WHERE n IS NOT NULL
        ON CONFLICT (name) DO UPDATE SET value = f.value + 1
        RETURNING f.value, f.k1, f.k2
    ), known AS MATERIALIZED (
        SELECT k1, k2 FROM fence
        UNION ALL
        SELECT r.k1, r.k2 FROM {table} r, got WHERE got.n IS NULL AND r.name = $5::bytea
    )
    SELECT (SELECT n FROM got) AS slot, (SELECT value FROM fence) AS token,
           (SELECT app0 FROM cfg) AS app0, (SELECT idle0 FROM cfg) AS idle0,
           (SELECT count(*) FROM shut) AS shut,
           (SELECT k1 FROM known) AS permits, (SELECT k2 FROM known) AS mark
"""
)

#: Try the slots of a semaphore. $1-$10 as above; $11 false: a newcomer, which
#: takes the gate shared for the statement's length, so it fails while anybody
#: waits (they hold or queue for the gate exclusively); true: the head waiter,
#: which holds the gate and lets it go with the slot it gets.
#: Returns (slot, token, app0, idle0, shut, permits, mark): the slot got (or
#: NULL), and the permits the fence row records with its mark.
TRY_SLOT = (
    """
    WITH gate AS MATERIALIZED (
        SELECT set_config('lock_timeout', $10, true) AS lt,
               CASE WHEN $11 THEN true ELSE pg_try_advisory_lock_shared($1::int4, $2::int4) END AS open
    ),"""
    + _SLOT
)

#: Queue for a semaphore's gate. $1, $2 the gate key; $3 lock_timeout ('0': no
#: limit); $4 idle_session_timeout (the head waits idle between its tries,
#: and a hung head must not keep the gate). Returns (ok).
WAIT_GATE = """
    SELECT set_config('lock_timeout', $3, true) AS lt,
           CASE WHEN $4::text IS NOT NULL THEN set_config('idle_session_timeout', $4, false) END AS idle,
           pg_advisory_lock($1::int4, $2::int4) IS NOT NULL AS ok
"""

#: Release a hold that changed nothing but its settings: unlock and put the
#: session's settings back. $1 application_name, $2 idle_session_timeout
#: (NULL: not touched).
RELEASE = """
    SELECT pg_advisory_unlock_all(), set_config('application_name', $1, false),
           CASE WHEN $2::text IS NOT NULL THEN set_config('idle_session_timeout', $2, false) END
"""

#: RELEASE for a semaphore's permit; $3 its channel, whose head waiter then tries again.
RELEASE_NOTIFY = """
    SELECT pg_advisory_unlock_all(), set_config('application_name', $1, false),
           CASE WHEN $2::text IS NOT NULL THEN set_config('idle_session_timeout', $2, false) END,
           pg_notify($3, '')
"""

#: Unlock what a try got when it waited for a fence row past lock_timeout
#: (the error rolled its settings back, not its session lock). No parameters.
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"

#: Arm the server's check for a client that is gone, before a wait.
SET_CHECK_INTERVAL = "SET client_connection_check_interval = {ms}"

#: A round trip that proves the session alive. No parameters.
PING = "SELECT 1"

#: The server's version. No parameters. Returns (server_version_num) as text.
SERVER_VERSION = "SELECT current_setting('server_version_num')"

#: Pieces of the clean-up of a connection in an unknown state (simple
#: protocol, one round trip, no parameters): every advisory lock of the
#: session is the hold's, since the pool hands out connections without any.
CLEANUP_PARTS = {
    "unlock": "SELECT pg_advisory_unlock_all()",
    "app": "RESET application_name",
    "idle": "RESET idle_session_timeout",
    "check": "RESET client_connection_check_interval",
    # {channel}: a semaphore's channel, hex digits only (see _keys.channel)
    "notify": "SELECT pg_notify('{channel}', '')",
}

#: Whether permits_key $1, $2 is held by anybody (tried exclusively and let go).
PERMITS_IN_USE = (
    "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4)"
    " THEN NOT pg_advisory_unlock($1::int4, $2::int4) ELSE true END"
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


#: The last token handed out for fence row $1 (no row: none yet). Returns (value).
TOKEN_OF = "SELECT value FROM {table} WHERE name = $1"

#: The permits a semaphore's fence row $1 records, locked for the transaction.
#: Returns (k1, k2): the permits, and the mark (-1, _keys.PERMITS_MARK) that says k1 is permits.
PERMITS_ROW = "SELECT k1, k2 FROM {table} WHERE name = $1 FOR UPDATE"

#: Record $2 as the permits of the semaphore whose fence row is $1.
RECORD_PERMITS = "UPDATE {table} SET k1 = $2, k2 = -1 WHERE name = $1"

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


class Statements:
    """The statements that name the fence table, with its quoted name filled in."""

    __slots__ = ("held_names", "permits_row", "record_permits", "token_of", "try_lock", "try_slot", "wait_lock")

    def __init__(self, table: str) -> None:
        self.try_lock = TRY_LOCK.format(table=table)
        self.wait_lock = WAIT_LOCK.format(table=table)
        self.try_slot = TRY_SLOT.format(table=table)
        self.token_of = TOKEN_OF.format(table=table)
        self.permits_row = PERMITS_ROW.format(table=table)
        self.record_permits = RECORD_PERMITS.format(table=table)
        self.held_names = HELD_NAMES.format(table=table)
