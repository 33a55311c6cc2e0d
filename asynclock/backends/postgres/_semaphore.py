"""The semaphore: N slot keys, on the shared sessions of its holds, and the queue on its gate key.

A semaphore of N permits is N advisory keys, slot 0 to N-1; a hold owns one
slot, on a session of its client, so a holder whose session ends frees its
permit at once. A newcomer tries the slots its client does not hold already
(in one statement, with the token), unless waiters are queued: they queue
on the gate key (``_queue``), and a release of a slot wakes the first, whose
try takes a free slot and tells the next to try too (two permits may have
come free at once).

Every client of a semaphore must ask for the same number of permits: the
fence row records the holders' number; each client holds the permits key
of its number shared (on its listening session) while it holds or asks
for a permit; a client that asks for another number while that key is
taken gets ValueError from its acquire, before it waits
(``check_permits``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from ...abc import Acquired
from ._grants import _waited_for_row
from ._hold import Hold, KeyState
from ._keys import PERMITS_MARK, fence_row, permits_key, slot_arrays
from ._listener import Listener
from ._queue import Queue
from ._requests import Requests
from ._sessions import Session, Sessions, ms
from ._sql import LIVE, next_token

__all__ = ["Permits", "SemaphoreStatements"]

_fetchrow = asyncpg.Connection.fetchrow
_fetchval = asyncpg.Connection.fetchval

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
#: Record $2 as the permits of the semaphore whose fence row is $1.
RECORD_PERMITS = "UPDATE {table} SET k1 = $2, k2 = -1 WHERE name = $1"
#: Whether permits_key $1, $2 is held by anybody (tried exclusively and let go).
PERMITS_IN_USE = (
    "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4)"
    " THEN NOT pg_advisory_unlock($1::int4, $2::int4) ELSE true END"
)


class SemaphoreStatements:
    """The semaphore's statements with the backend's names and token source filled in."""

    __slots__ = ("head_slot", "permits_row", "record_permits", "try_slot")

    def __init__(self, table: str, queue: str, sequence: str | None, first_token: str) -> None:
        fence = _FENCE_SEQUENCE if sequence is not None else _FENCE_TABLE
        fence = fence.format(table=table, first=first_token)
        result_token = next_token(sequence) if sequence is not None else "(SELECT value FROM fence)"
        fill = {"table": table, "queue": queue, "fence": fence, "token": result_token}
        self.try_slot = TRY_SLOT.format(**fill)
        self.head_slot = HEAD_SLOT.format(**fill)
        self.permits_row = PERMITS_ROW.format(table=table)
        self.record_permits = RECORD_PERMITS.format(table=table)


class Permits:
    """Requests of a semaphore's holds."""

    def __init__(self, requests: Requests, queue: Queue, sessions: Sessions, listener: Listener, prefix: str) -> None:
        self._requests = requests
        self._queue = queue
        self._sessions = sessions
        self._listener = listener
        self._prefix = prefix
        self.sql: SemaphoreStatements | None = None

    def _free_slots(self, record: Hold) -> tuple[list[int], list[int]]:
        """The slot keys this client does not hold (a session would let itself in again)."""
        highs, lows = slot_arrays(self._prefix, record.ref.name, record.ref.permits)
        mine = {hold.slot for hold in record.state.holders.values()}
        if not mine:
            return highs, lows
        pairs = [(h, low) for h, low in zip(highs, lows, strict=True) if (h, low) not in mine]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    async def try_acquire(self, record: Hold, enqueue: bool) -> Acquired | None:
        """Take a permit at once (Acquired), else None; with ``enqueue`` the hold is queued by then."""
        state = record.state
        if record.permits_key is None:
            record.permits_key = permits_key(self._prefix, record.ref.name, record.ref.permits)
            self._listener.want(record.permits_key)
        await self._listener.ensure(record.permits_key)
        await state.enter()
        try:
            if state.unknown:
                await self.settle(state)
            if not state.waiting:
                got = await self._try(record)
                if got is not None:
                    return got
            if not enqueue:
                return None
            self._queue.count_in(record)
        finally:
            state.leave()
        await self._queue.enqueue(record)
        assert record.woken is not None
        record.woken.clear()
        return await self.head_try(record)

    async def _session(self, ttl: float) -> Session:
        sessions = self._sessions
        session = sessions.idle_session() or await sessions.get(ttl)
        if session.idle < ttl and sessions.pg14:
            await session.enter()
            try:
                if session.idle < ttl:
                    await sessions.raise_idle(session, ttl)
            finally:
                session.leave()
        return session

    async def _try(self, record: Hold) -> Acquired | None:
        state, ttl, requests, sql = record.state, record.ttl, self._requests, self.sql
        assert sql is not None
        session = await self._session(ttl)
        highs, lows = self._free_slots(record)
        q1, q2 = state.marker
        try:
            row = await requests.run(
                session, ttl, _fetchrow, sql.try_slot,
                q1, q2, highs, lows, fence_row(record.ref), record.ref.permits, ms(ttl / 6),
            )  # fmt: skip
        except BaseException as exc:
            state.unknown.append(session)
            if not _waited_for_row(exc):
                self._requests.settle_soon(state, self.settle)
                raise
            await self.settle(state)
            return None
        return await self._answer(record, session, row, None)

    async def head_try(self, record: Hold) -> Acquired | None:
        """The queued ``record`` tries: a slot if it is first in line and one is free, else None."""
        state, ttl, requests, sql = record.state, record.ttl, self._requests, self.sql
        assert sql is not None
        await state.enter()
        try:
            if state.unknown:
                await self.settle(state)
            if record.granted:
                return Acquired(record.token)
            if record.ticket is None:
                return None
            session = await self._session(ttl)
            highs, lows = self._free_slots(record)
            g1, g2 = state.key
            sent = asyncio.get_running_loop().time()
            try:
                row = await requests.run(
                    session, ttl, _fetchrow, sql.head_slot,
                    g1, g2, highs, lows, fence_row(record.ref), record.ref.permits, ms(ttl / 6), record.ticket,
                )  # fmt: skip
            except BaseException as exc:
                state.unknown.append(session)
                if not _waited_for_row(exc):
                    self._requests.settle_soon(state, self.settle)
                    raise
                await self.settle(state)
                return None
            record.head = row["head"]
            if not row["present"]:
                record.ticket = None
                return None
            if row["k1"] is None:
                return None
            record.ticket = None
            self._queue.count_out(record)
            return await self._answer(record, session, row, sent)
        finally:
            state.leave()

    async def _answer(self, record: Hold, session: Session, row: Any, sent: float | None) -> Acquired | None:
        """A slot statement's answer: the permit (permits checked), or None (none free, or waiters queued)."""
        state = record.state
        slot = None if row["k1"] is None else (row["k1"], row["k2"])
        try:
            await self.check_permits(record, session, row, slot is not None)
            if slot is None:
                return None
            token = await self._requests.checked_token(session, record.ttl, row["token"])
        except BaseException:
            if slot is not None:
                state.unknown.append(session)  # a slot no hold claims: let go of it
                await self.settle(state)
            raise
        record.slot = slot
        record.session = session
        record.granted = True
        record.token = token
        state.holders[record.hold] = record
        session.holds.add(record)
        return Acquired(token, confirmed_at=sent)

    async def check_permits(self, record: Hold, session: Session, row: Any, granted: bool) -> None:
        """ValueError if the semaphore is held with another number of permits than this hold's.

        ``row`` is the answer of a slot statement: the permits its fence row
        records. Every client holds :func:`permits_key` of its number shared
        while it holds or asks, so a number is in use while that key cannot
        be taken exclusively. The record changes only when it differs from
        ours and its number is no longer in use (a client of the new number
        holds a slot by then), under the row's lock, so two clients that
        disagree never both hold. Costs nothing while the record matches.
        """
        permits = record.ref.permits
        if row["permits"] == permits and row["mark"] == PERMITS_MARK:
            return
        if row["permits"] is None and not granted:
            return  # nothing recorded yet: the first hold records it
        sql = self.sql
        assert sql is not None
        name, fence = record.ref.name, fence_row(record.ref)
        requests = self._requests
        await session.enter()
        try:
            conn = session.conn
            async with requests.errors, asyncio.timeout(record.ttl), conn.transaction():
                current = await conn.fetchrow(sql.permits_row, fence)
                if current is None or (current["k1"] == permits and current["k2"] == PERMITS_MARK):
                    return
                if current["k2"] == PERMITS_MARK:
                    theirs = int(current["k1"])
                    in_use = await conn.fetchval(PERMITS_IN_USE, *permits_key(self._prefix, name, theirs))
                    if in_use:
                        raise ValueError(
                            f"semaphore {name!r} is held with permits={theirs} by other clients; this one asks for"
                            f" permits={permits}: every client of a semaphore must use the same number"
                        )
                if granted:
                    await conn.execute(sql.record_permits, fence, permits)
        finally:
            session.leave()

    async def release(self, record: Hold) -> bool:
        """Give ``record``'s permit up (or take it out of the queue); True only if it held one."""
        state, requests = record.state, self._requests
        await state.enter()
        try:
            if not record.granted:
                if record.marked or record.ticket is not None or record.queuing is not None:
                    await self._queue.leave(record)
                if state.unknown:
                    await self.settle(state)
                return False
            record.granted = False
            record.released = True
            session, slot = record.session, record.slot
            assert session is not None and slot is not None
            state.holders.pop(record.hold, None)
            session.holds.discard(record)
            if record.lost:
                return False
            return await requests.unlock(state, session, record.ttl, slot, False, self.settle)
        finally:
            state.leave()

    async def settle(self, state: KeyState) -> None:
        """Let go of slots that requests cut short left (the caller has the key's turn)."""
        holders = list(state.holders.values())
        await self._requests.settle(
            state, state.slots, lambda session, key: any(h.session is session and h.slot == key for h in holders)
        )
