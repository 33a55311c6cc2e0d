"""The schema objects of a fence table, and where fencing tokens come from.

One name, ``table=`` (default ``<prefix>_fence``), gives three objects, all
UNLOGGED so that no acquire writes WAL or waits for a flush:

* the fence table: a row per name (``names()`` reads it), on servers before
  PostgreSQL 15 also the name's token counter;
* ``<table>_queue``: the waiters (see ``_queue``);
* ``<table>_token`` (PostgreSQL 15+): the token sequence. A token is its
  ``nextval``, taken in the statement that takes the lock: no row lock, no
  transaction id, no commit record. One sequence for every name still gives
  each name strictly increasing tokens, since the next holder's ``nextval``
  runs after the previous holder's.

A crash (or a restore, or a failover to a standby) empties unlogged objects.
The sequence then starts again from its first value, 1, so it is seeded with
the server's time in µs when it is made, and any token below ``FLOOR``
(10**15 µs, September 2001) is never handed out: the statement that drew it
holds the lock still, and :func:`fresh_token` reseeds the sequence from the
clock (serialised by an advisory lock, re-checked under it, so that two
reseeders cannot set it below a token already handed out) and draws again.
Tokens after a crash are then above every earlier one while the server's
clock has not stepped back by more than the time since, and fewer than a
million tokens a second were drawn: the clock assumption of the counter
table too. The table counter starts again from the time in µs after a
crash (its epoch row, written durably with the table and gone with its
contents, tells a new table, which counts from 1, from an emptied one).

Mixing versions: a client of a version that counts in the table gives
tokens below the sequence's (the sequence is seeded above the table's
highest counter, and counts on from there): after the sequence has been
used for a name, such a client's tokens for that name go back. Upgrade
every client of a prefix before tokens from both are compared.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ._keys import EPOCH_ROW, SEED_KEY

__all__ = ["FIRST_TOKEN", "FLOOR", "create", "fresh_token", "quote_table", "set_up"]

#: Tokens below this come from a sequence that a crash reset: never handed out.
FLOOR = 10**15

#: Token table: a name's first token, one above the epoch row's value (0), or
#: above the server time in µs when a crash has emptied the table (no epoch row).
FIRST_TOKEN = (
    "coalesce((SELECT e.value FROM {table} e WHERE e.name = '\\xff65706f636800'::bytea),"
    " (extract(epoch from clock_timestamp()) * 1000000)::int8) + 1"
)

#: Seed the sequence from the clock, above the table's counters, unless it is seeded.
#: $1 FLOOR. Run under the seed lock (a transaction-level advisory lock).
_RESEED = (
    "SELECT CASE WHEN coalesce(pg_sequence_last_value('{seq}'::regclass), 0) < $1 THEN"
    " setval('{seq}'::regclass, greatest((extract(epoch from clock_timestamp()) * 1000000)::int8,"
    " (SELECT coalesce(max(f.value), 0) + 1 FROM {table} f)))"
    " END"
)


def quote_table(table: str, suffix: str = "") -> str:
    """``table`` or ``schema.table`` (with ``suffix`` added to the table's part) as a quoted SQL name."""
    parts = table.split(".", 1)
    parts[-1] += suffix
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


def _literal(name: str) -> str:
    return name.replace("'", "''")


async def set_up(conn: Any, table: str, queue: str, sequence: str | None) -> None:
    """Create what is missing of the fence table ``table``, its ``queue`` and token ``sequence`` (quoted names)."""
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
        await create(
            conn,
            f"CREATE UNLOGGED TABLE {table} ("
            "name bytea PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL, value bigint NOT NULL)",
            f"INSERT INTO {table} (name, k1, k2, value) VALUES ('\\x{EPOCH_ROW.hex()}'::bytea, 0, 0, 0)",
        )
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", queue):
        await create(
            conn,
            f"CREATE UNLOGGED TABLE {queue} (ticket bigserial PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL,"
            " shared boolean NOT NULL, hold text NOT NULL, client text NOT NULL, s1 int4 NOT NULL, s2 int4 NOT NULL)",
            f"CREATE INDEX ON {queue} (k1, k2, ticket)",
        )
    if sequence is not None:
        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", sequence):
            await create(conn, f"CREATE UNLOGGED SEQUENCE {sequence}")
        await _reseed(conn, table, sequence)


async def create(conn: Any, *statements: str) -> None:
    """Run ``statements`` (creating schema objects) in one durable transaction; another client's
    object made at the same moment counts as made."""
    try:
        async with conn.transaction():
            # Durable whatever the server's setting: an object lost in a crash
            # would come back new (a table without its epoch row counts from 1).
            await conn.execute("SET LOCAL synchronous_commit = on")
            for statement in statements:
                await conn.execute(statement)
    except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError):
        # Another client created it at the same moment (its error comes once
        # the winner committed): the winner's object, epoch row included.
        pass


async def _reseed(conn: Any, table: str, sequence: str) -> None:
    """Seed ``sequence`` from the clock unless it is seeded: serialised, and checked again under the lock."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1::int4, $2::int4)", *SEED_KEY)
        await conn.execute(_RESEED.format(seq=_literal(sequence), table=table), FLOOR)


async def fresh_token(conn: Any, table: str, sequence: str) -> int:
    """A token from a sequence a crash had reset: seed it (if nobody has yet) and draw again."""
    await _reseed(conn, table, sequence)
    return int(await conn.fetchval(f"SELECT nextval('{_literal(sequence)}'::regclass)"))
