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

The set-up (:func:`set_up`) reads the server's version, makes what is missing
and returns what it found as one :class:`Schema`, with which the backend's
parts are built.

Mixing versions: a client of a version that counts in the table gives
tokens below the sequence's (the sequence is seeded above the table's
highest counter, and counts on from there): after the sequence has been
used for a name, such a client's tokens for that name go back. Upgrade
every client of a prefix before tokens from both are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from ._keys import SEED_KEY
from ._sql import (
    CREATE_FENCE,
    CREATE_QUEUE,
    CREATE_SEQUENCE,
    DURABLE,
    EPOCH,
    EXISTS,
    QUEUE_INDEX,
    SEED_LOCK,
    SERVER_VERSION,
    Statements,
)

__all__ = ["FLOOR", "Schema", "create", "fresh_token", "quote_table", "set_up"]

#: Tokens below this come from a sequence that a crash reset: never handed out.
FLOOR = 10**15


@dataclass(frozen=True, slots=True)
class Schema:
    """What the set-up found on the server and made there, as the backend's parts are built with it."""

    #: The quoted names of the fence table, its queue table, its leaders table (made on the first
    #: election's request) and its token sequence (None: tokens from the fence table's counters).
    table: str
    queue: str
    leaders: str
    sequence: str | None
    #: PostgreSQL 14+: sessions run with idle_session_timeout (the lease is the session).
    pg14: bool
    #: Every statement, with these names and the token source filled in.
    sql: Statements


def quote_table(table: str, suffix: str = "") -> str:
    """``table`` or ``schema.table`` (with ``suffix`` added to the table's part) as a quoted SQL name."""
    parts = table.split(".", 1)
    parts[-1] += suffix
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


async def set_up(conn: Any, name: str, sequence_tokens: bool | None) -> Schema:
    """Read the server's version and create what is missing of the fence table ``name`` (unquoted,
    ``schema.table`` allowed), its queue and its token sequence.

    ``sequence_tokens``: None, tokens from a sequence where the server has
    one (PostgreSQL 15+); False, from the fence table; True, from a sequence.
    Errors are asyncpg's (the caller's edge translates them).
    """
    version = int(await conn.fetchval(SERVER_VERSION))
    use_sequence = version >= 150000 if sequence_tokens is None else sequence_tokens
    table, queue = quote_table(name), quote_table(name, "_queue")
    sequence = quote_table(name, "_token") if use_sequence else None
    leaders = quote_table(name, "_leaders")
    sql = Statements(table, queue, sequence, leaders)
    if not await conn.fetchval(EXISTS, table):
        await create(conn, CREATE_FENCE.format(table=table), EPOCH.format(table=table))
    if not await conn.fetchval(EXISTS, queue):
        await create(conn, CREATE_QUEUE.format(queue=queue), QUEUE_INDEX.format(queue=queue))
    if sequence is not None:
        if not await conn.fetchval(EXISTS, sequence):
            await create(conn, CREATE_SEQUENCE.format(sequence=sequence))
        await _reseed(conn, sql)
    return Schema(table, queue, leaders, sequence, version >= 140000, sql)


async def create(conn: Any, *statements: str) -> None:
    """Run ``statements`` (creating schema objects) in one durable transaction; another client's
    object made at the same moment counts as made."""
    try:
        async with conn.transaction():
            # Durable whatever the server's setting: an object lost in a crash
            # would come back new (a table without its epoch row counts from 1).
            await conn.execute(DURABLE)
            for statement in statements:
                await conn.execute(statement)
    except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError):
        # Another client created it at the same moment (its error comes once
        # the winner committed): the winner's object, epoch row included.
        pass


async def _reseed(conn: Any, sql: Statements) -> None:
    """Seed the token sequence from the clock unless it is seeded: serialised, and checked again under the lock."""
    assert sql.reseed is not None
    async with conn.transaction():
        await conn.execute(SEED_LOCK, *SEED_KEY)
        await conn.execute(sql.reseed, FLOOR)


async def fresh_token(conn: Any, sql: Statements) -> int:
    """A token from a sequence a crash had reset: seed it (if nobody has yet) and draw again."""
    assert sql.draw is not None
    await _reseed(conn, sql)
    return int(await conn.fetchval(sql.draw))
