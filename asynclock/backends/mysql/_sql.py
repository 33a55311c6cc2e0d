"""Every statement the backend sends, each with its ``%s`` contract.

The fence table (``{table}``, default ``<prefix>_fence``, InnoDB) has a row
per key a client ever took: ``k`` the key, ``kind`` (``l`` lock, ``e``
election, ``c`` a semaphore's counter, ``s`` one of its slots), ``name`` the
name asked for, ``token`` the last fencing token given for it, and who took
it last: ``conn`` its session's ``CONNECTION_ID()`` and ``owner`` (the
holder's id; an election's: the leader's identity; ``since``: when its term
began). A row says who holds a key only while that session holds the key
(``conn = IS_USED_LOCK(k)``): nothing is written at a release.

A token is ``LAST_INSERT_ID(token + 1)`` of the key's row, in the statement
that takes the lock, after ``GET_LOCK`` granted it: the server reports it in
the statement's OK packet (the cursor's ``lastrowid``), so the grant and its
token are one round trip. The row is committed with the statement (InnoDB),
so tokens keep increasing across restarts of the server (as durable as its
commits: ``innodb_flush_log_at_trx_commit``).

Conventions: a statement that may wait in ``GET_LOCK`` starts with a comment
naming the marker of the key it waits for (``/*asynclock wait <marker>*/``),
by which ``info`` counts the waiters in the process list; ``CASE`` evaluates
its ``WHEN`` branches in order and stops at the first true one.
"""

from __future__ import annotations

__all__ = [
    "COUNT_SLOT",
    "CREATE",
    "EXISTS",
    "INFO_LOCK",
    "LEADER",
    "LOCK_TABLES",
    "NAMES",
    "OWNER",
    "PERMITS_ROW",
    "PERMITS_SET",
    "RELEASE",
    "RELEASE_TERM",
    "SETTLE",
    "SET_TIMEOUT",
    "SLOT_ROW",
    "TAKE",
    "TAKE_ELECTION",
    "TERM",
    "WAIT",
    "WAITERS",
    "Statements",
    "info_slots",
    "permits_check",
    "quote_table",
    "try_slots",
    "waiting",
]


def quote_table(table: str) -> str:
    """``table`` as a quoted identifier."""
    return "`" + table.replace("`", "``") + "`"


def waiting(marker: str, statement: str) -> str:
    """``statement`` marked as a wait for the key whose marker is ``marker`` (hex digits: safe to inline)."""
    return f"/*asynclock wait {marker}*/ {statement}"


#: Whether the fence table is there (an error 1146 says it is not). No parameters.
EXISTS = "SELECT 1 FROM {table} LIMIT 0"

#: Make the fence table. No parameters.
CREATE = """
    CREATE TABLE IF NOT EXISTS {table} (
        k VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
        kind CHAR(1) CHARACTER SET ascii NOT NULL,
        name VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        token BIGINT NOT NULL,
        conn BIGINT UNSIGNED NULL,
        owner VARCHAR(1100) CHARACTER SET utf8mb4 NULL,
        permits INT NULL,
        since DOUBLE NULL
    ) ENGINE=InnoDB
"""

#: The session's idle timeout: the server ends a session idle this long (and its locks). %s whole seconds.
SET_TIMEOUT = "SET SESSION wait_timeout = %s"

#: Take a plain lock and its token in one statement, waiting for it up to a timeout.
#: %s: key, name, owner, key, timeout (seconds; 0: try once), owner.
#: Affected rows: 0 (not taken: busy, timed out, or the wait was killed), else taken, with the
#: token as the statement's last insert id.
TAKE = """
    INSERT INTO {table} (k, kind, name, token, conn, owner)
    SELECT %s, 'l', %s, LAST_INSERT_ID(1), CONNECTION_ID(), %s FROM DUAL WHERE GET_LOCK(%s, %s) = 1
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), conn = CONNECTION_ID(), owner = %s
"""

#: TAKE for an election's key: the leader's identity as owner, and the term's start.
#: %s: key, name, identity, key, timeout, identity. Affected rows and last insert id as TAKE.
TAKE_ELECTION = """
    INSERT INTO {table} (k, kind, name, token, conn, owner, since)
    SELECT %s, 'e', %s, LAST_INSERT_ID(1), CONNECTION_ID(), %s, UNIX_TIMESTAMP(SYSDATE(6)) FROM DUAL
    WHERE GET_LOCK(%s, %s) = 1
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), conn = CONNECTION_ID(), owner = %s,
                            since = UNIX_TIMESTAMP(SYSDATE(6))
"""

#: Name the holder of a key this session took for somebody else (a waiter that left first).
#: %s: owner, key. Affected rows: 1.
OWNER = "UPDATE {table} SET owner = %s WHERE k = %s AND conn = CONNECTION_ID()"

#: Wait for a key without a token (a semaphore's slot, an election's term key). %s: key, timeout.
#: One row: 1 (taken), 0 (timed out) or NULL (the wait was killed).
WAIT = "SELECT GET_LOCK(%s, %s)"

#: The leader's term key, taken after its election's key. %s: term key, timeout. One row as WAIT.
TERM = WAIT

#: Let go of a key. %s: key. One row: 1 (let go), 0 (another session holds it), NULL (nobody).
RELEASE = "SELECT RELEASE_LOCK(%s)"

#: Let go of a key if this session holds it (what a statement that failed after its GET_LOCK may have
#: left). %s: key, key. One row: 1 (let go), NULL (this session did not hold it).
SETTLE = "SELECT IF(IS_USED_LOCK(%s) = CONNECTION_ID(), RELEASE_LOCK(%s), NULL)"

#: Let go of a leader's term key, then its election's key. %s: term key, election key. One row of two.
RELEASE_TERM = "SELECT RELEASE_LOCK(%s), RELEASE_LOCK(%s)"


def try_slots(count: int) -> str:
    """Try ``count`` slot keys of a semaphore in order and take the first that is free.

    %s: (slot key, slot number) ``count`` times, then the semaphore's base key.
    One row: the slot number taken (-1: none), and the permits its counter row records (NULL: none yet).
    """
    branches = " ".join("WHEN GET_LOCK(%s, 0) = 1 THEN %s" for _ in range(count))
    return f"SELECT CASE {branches} ELSE -1 END, (SELECT permits FROM {{table}} WHERE k = %s)"


#: The token of a permit just taken: its semaphore's counter row counts on, if it records this
#: number of permits (or none yet, or the row is new: then it records it).
#: %s: base key, name, permits, permits, permits. Last insert id: the token, or 0 when the row records
#: another number (then nothing changed).
COUNT_SLOT = """
    INSERT INTO {table} (k, kind, name, token, permits) VALUES (%s, 'c', %s, LAST_INSERT_ID(1), %s)
    ON DUPLICATE KEY UPDATE token = IF(permits <=> %s OR permits IS NULL, LAST_INSERT_ID(token + 1),
                                       token + LAST_INSERT_ID(0)),
                            permits = IFNULL(permits, %s)
"""

#: Who holds a slot: its row. %s: slot key, name, token, owner, token, owner.
SLOT_ROW = """
    INSERT INTO {table} (k, kind, name, token, conn, owner) VALUES (%s, 's', %s, %s, CONNECTION_ID(), %s)
    ON DUPLICATE KEY UPDATE token = %s, conn = CONNECTION_ID(), owner = %s
"""

#: The permits a semaphore's counter row records, its row locked till the end of the
#: transaction (another number is recorded under this lock only). %s: base key. One row, or none.
PERMITS_ROW = "SELECT permits FROM {table} WHERE k = %s FOR UPDATE"


def permits_check(count: int) -> str:
    """How many of ``count`` slot keys another session holds. %s: the slot keys. One row: the count."""
    used = " + ".join("(IFNULL(IS_USED_LOCK(%s), CONNECTION_ID()) <> CONNECTION_ID())" for _ in range(count))
    return f"SELECT {used}"


#: Record another number of permits, with a token for the hold that changes it (in the transaction
#: of PERMITS_ROW). %s: permits, base key. Last insert id: the token.
PERMITS_SET = "UPDATE {table} SET permits = %s, token = LAST_INSERT_ID(token + 1) WHERE k = %s"

#: What the server knows of a plain lock or an election. %s: key, marker, key.
#: One row: the session holding it (NULL: free), the row's session, token and owner (NULLs: no
#: row), and how many other sessions wait for it (statements marked as waits for the marker; the
#: pattern is put together in the server, so this statement's own text does not match it).
INFO_LOCK = """
    SELECT IS_USED_LOCK(%s), f.conn, f.token, f.owner,
           (SELECT COUNT(*) FROM information_schema.PROCESSLIST
            WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('/*asynclock', ' wait ', %s, '*/%%'))
    FROM (SELECT 1 AS one) AS d LEFT JOIN {table} AS f ON f.k = %s
"""

#: How many sessions other than this one wait for a key, by its marker. %s: the marker.
WAITERS = """
    SELECT COUNT(*) FROM information_schema.PROCESSLIST
    WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('/*asynclock', ' wait ', %s, '*/%%')
"""

#: The leader of an election: its row while somebody holds the election's key, and whether the
#: row's session holds both that key and the term key (1: a leader; 0: a candidate was granted the
#: key and is taking its term key, or writing its row). %s: term key, election key.
#: One row (identity, token, since, live), or none (nobody holds the election's key).
LEADER = """
    SELECT owner, token, since, IFNULL(conn = IS_USED_LOCK(k) AND conn = IS_USED_LOCK(%s), 0) FROM {table}
    WHERE k = %s AND kind = 'e' AND IS_USED_LOCK(k) IS NOT NULL
"""

#: The plain locks with a row whose session holds them now. No parameters. Rows: key, name.
NAMES = "SELECT k, name FROM {table} WHERE kind = 'l' AND conn = IS_USED_LOCK(k)"

#: The server's own table of the named locks held now, where it has one: MariaDB's (with its
#: ``metadata_lock_info`` plugin) and MySQL's (``performance_schema``). %s: a LIKE pattern of keys.
#: Rows: key.
LOCK_TABLES = (
    "SELECT TABLE_SCHEMA FROM information_schema.METADATA_LOCK_INFO WHERE LOCK_TYPE = 'User lock'"
    " AND TABLE_SCHEMA LIKE %s",
    "SELECT OBJECT_NAME FROM performance_schema.metadata_locks WHERE OBJECT_TYPE = 'USER LEVEL LOCK'"
    " AND LOCK_STATUS = 'GRANTED' AND OBJECT_NAME LIKE %s",
)


def info_slots(count: int) -> str:
    """The holders of a semaphore's ``count`` slots: one row per slot row whose session holds the slot.

    %s: the slot keys. Rows: owner, token (the oldest hold first).
    """
    slots = ", ".join("%s" for _ in range(count))
    return (
        f"SELECT f.owner, f.token FROM {{table}} AS f WHERE f.k IN ({slots})"
        " AND f.conn = IS_USED_LOCK(f.k) ORDER BY f.token"
    )


class Statements:
    """The statements with the fence table's name filled in, made once per backend; the
    statements of a semaphore (one per number of slots) as they are asked for."""

    __slots__ = (
        "_built",
        "count_slot",
        "create",
        "exists",
        "info_lock",
        "leader",
        "names",
        "owner",
        "permits_row",
        "permits_set",
        "slot_row",
        "table",
        "take",
        "take_election",
    )

    def __init__(self, table: str) -> None:
        self.table = quote_table(table)
        fill = self.fill
        self.exists = fill(EXISTS)
        self.create = fill(CREATE)
        self.take = fill(TAKE)
        self.take_election = fill(TAKE_ELECTION)
        self.owner = fill(OWNER)
        self.count_slot = fill(COUNT_SLOT)
        self.slot_row = fill(SLOT_ROW)
        self.permits_row = fill(PERMITS_ROW)
        self.permits_set = fill(PERMITS_SET)
        self.info_lock = fill(INFO_LOCK)
        self.leader = fill(LEADER)
        self.names = fill(NAMES)
        self._built: dict[tuple[str, int], str] = {}

    def fill(self, statement: str) -> str:
        """``statement`` with ``{table}`` filled in, on one line (fewer bytes to send and parse)."""
        return " ".join(statement.replace("{table}", self.table).split())

    def slots(self, which: str, count: int) -> str:
        """The semaphore statement ``which`` ("try", "info" or "check") for ``count`` slots."""
        built = self._built.get((which, count))
        if built is None:
            make = {"try": try_slots, "info": info_slots, "check": permits_check}[which]
            built = self._built[which, count] = self.fill(make(count))
        return built
