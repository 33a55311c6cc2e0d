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
from ._hold import Hold, KeyState, Session
from ._keys import PERMITS_MARK, fence_row, permits_key, slot_arrays
from ._listener import Listener
from ._pool import ms
from ._queue import Queue
from ._requests import Requests, waited_for_row
from ._sql import PERMITS_IN_USE

__all__ = ["Permits"]

_fetchrow = asyncpg.Connection.fetchrow
_fetchval = asyncpg.Connection.fetchval


class Permits:
    """Requests of a semaphore's holds."""

    def __init__(self, requests: Requests, queue: Queue, listener: Listener, prefix: str) -> None:
        self._requests = requests
        self._sql = requests.sql
        self._queue = queue
        self._sessions = requests.sessions
        self._listener = listener
        self._prefix = prefix

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
        state, ttl, requests, sql = record.state, record.ttl, self._requests, self._sql
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
            if not waited_for_row(exc):
                self._requests.settle_soon(state, self.settle)
                raise
            await self.settle(state)
            return None
        return await self._answer(record, session, row, None)

    async def head_try(self, record: Hold) -> Acquired | None:
        """The queued ``record`` tries: a slot if it is first in line and one is free, else None."""
        state, ttl, requests, sql = record.state, record.ttl, self._requests, self._sql
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
                if not waited_for_row(exc):
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
        sql = self._sql
        name, fence = record.ref.name, fence_row(record.ref)
        requests = self._requests
        await session.enter()
        try:
            conn = session.conn
            async with requests.errors.edge, asyncio.timeout(record.ttl), conn.transaction():
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
