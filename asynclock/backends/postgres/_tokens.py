"""The fencing token source: a per-name counter in the fence table.

The lock statements (``_sql``) take a hold's token in the statement that
takes the lock: an UPSERT of the name's row, one above its last value. The
table is UNLOGGED, so an increment writes no WAL and an acquire never waits
for a WAL flush, whatever ``synchronous_commit`` says. A crash (or a
restore, or a failover to a standby) empties such a table; the counters then
start again from the server time in µs, above every token handed out before
as long as the server's clock has not stepped back by more than the time
since then. A new table counts each name from 1: its epoch row, written with
the table (durably) and gone with its contents, tells the two cases apart.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ._keys import EPOCH_ROW

__all__ = ["create_table", "quote_table"]


def quote_table(table: str) -> str:
    """``table`` or ``schema.table`` as a quoted SQL name."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in table.split(".", 1))


async def create_table(conn: Any, table: str) -> None:
    """Create the fence table ``table`` (quoted) with its epoch row, unless it is there already."""
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
        return
    try:
        async with conn.transaction():
            # Durable whatever the server's setting: a table lost in a crash
            # would come back new, with an epoch row, and count from 1 again.
            await conn.execute("SET LOCAL synchronous_commit = on")
            await conn.execute(
                f"CREATE UNLOGGED TABLE {table} ("
                "name bytea PRIMARY KEY, k1 int4 NOT NULL, k2 int4 NOT NULL, value bigint NOT NULL)"
            )
            await conn.execute(f"INSERT INTO {table} (name, k1, k2, value) VALUES ($1, 0, 0, 0)", EPOCH_ROW)
    except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError):
        # Another client created it at the same moment (its error comes once
        # the winner committed): the winner's table, epoch row included.
        pass
