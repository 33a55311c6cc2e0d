"""The semaphore: N slot keys, on the shared sessions of its holds, and its line waiting on every slot.

A semaphore of N permits is N keys, slot 0 to N-1 (``_keys.slot_key``); a
hold owns one slot, on a session of its client, so a holder whose session
ends frees its permit at once. A newcomer tries, in one statement, the
slots its client does not hold already (the server would let a session in
again), unless its client has waiters in line; its token comes from the
semaphore's counter row, its holder is written in the slot's row. Waiting,
the client's line waits on every slot at once, a session per slot
(``_lines``): the first slot released goes to the first waiter.

Every client of a semaphore must ask for the same number of permits: the
counter row records the holders' number, and a token is drawn only for a
hold of that number (``_sql.COUNT_SLOT``). A hold of another number is let
in only when none of the recorded number's slots is held by anybody else,
and then records its own, under the row's lock, so two clients that
disagree never both hold; otherwise its acquire raises ValueError at once
(``check_permits``).
"""

from __future__ import annotations

import asyncio
import contextlib

from ..._errors import LockError
from ...abc import Acquired
from ._grants import Grants, interrupted, owner_of
from ._hold import Hold, Session
from ._keys import slot_keys
from ._lines import Lines
from ._requests import Requests
from ._sql import RELEASE, SETTLE, WAIT, waiting

__all__ = ["Permits"]


class Permits:
    """Requests of a semaphore's holds, and their waits (a ``_lines.Taker``)."""

    def __init__(self, requests: Requests, lines: Lines, grants: Grants, prefix: str) -> None:
        self._requests = requests
        self._sessions = requests.sessions
        self._sql = requests.sql
        self._lines = lines
        self._grants = grants
        self._prefix = prefix

    async def try_acquire(self, record: Hold, enqueue: bool) -> Acquired | None:
        """Take a permit at once (Acquired), else None; with ``enqueue`` the hold is in line by then."""
        state = record.state
        await state.enter()
        try:
            line = state.line
            if not (line is not None and line.count):
                got = await self._try(record)
                if got is not None:
                    return got
            if enqueue:
                self._lines.join(record, self)
            return None
        finally:
            state.leave()

    async def _try(self, record: Hold) -> Acquired | None:
        state, ttl, requests, sessions = record.state, record.ttl, self._requests, self._sessions
        mine = {hold.key for hold in state.holders.values()}
        free = [(slot, key) for slot, key in enumerate(state.slots) if key not in mine]
        if not free:
            return None  # (this client holds every permit itself)
        session = sessions.idle_session() or await sessions.get(ttl)
        try:
            await self._grants.ensure_timeout(session, ttl)
            args: list[object] = []
            for slot, key in free:
                args += [key, slot]
            args.append(state.key)
            try:
                rows, _n, _id = await requests.execute(session, self._sql.slots("try", len(free)), args, ttl)
            except LockError:
                # (a slot its GET_LOCK took before the error is let go of: no slot of the semaphore
                # was this session's before, as this client holds none of the ones tried)
                if not session.gone:
                    with contextlib.suppress(LockError):
                        for _slot, key in free:
                            await requests.execute(session, SETTLE, (key, key), ttl)
                raise
            slot, recorded = rows[0]
            if slot < 0:
                if recorded is not None and recorded != record.ref.permits:
                    await self._refuse_if_used(session, record, int(recorded))
                return None
            key = state.slots[slot]
            token = await self._count(session, key, record, record)
        finally:
            if not session.holds:
                sessions.used(session)
        self._grants.hold_on(record, session, key, token)
        return Acquired(token)

    async def _count(self, session: Session, key: str, record: Hold, head: Hold) -> int:
        """The token of the permit ``key`` just taken on ``session`` for ``record``, and its slot's row;
        the slot let go of (and ValueError for a disagreeing number of permits) if that fails."""
        state, ttl, requests, sql = record.state, record.ttl, self._requests, self._sql
        permits, name = record.ref.permits, record.ref.name
        try:
            _rows, _n, token = await requests.execute(
                session, sql.count_slot, (state.key, name, permits, permits, permits), ttl
            )
            if token == 0:
                token = await self._check_permits(session, record)
            owner = owner_of(record.hold)
            await requests.execute(session, sql.slot_row, (key, name, token, owner, token, owner), ttl)
        except BaseException:
            if not session.gone:
                await self.let_go(session, key, head)
            raise
        return int(token)

    async def _check_permits(self, session: Session, record: Hold) -> int:
        """The counter row records another number of permits than ``record``'s: if none of its slots is
        held by another session, record this number (and draw the token); else ValueError."""
        requests, sql, ttl = self._requests, self._sql, record.ttl
        conn = session.conn
        async with requests.errors.edge, asyncio.timeout(max(ttl, 1.0)):
            await session.enter()
            try:
                await conn.begin()
                try:
                    cursor = session.cursor
                    await cursor.execute(sql.permits_row, (record.state.key,))
                    row = await cursor.fetchone()
                    recorded = None if row is None else row[0]
                    if recorded is not None and recorded != record.ref.permits:
                        self._raise_if_used(await self._used(session, record, int(recorded)), record, int(recorded))
                    await cursor.execute(sql.permits_set, (record.ref.permits, record.state.key))
                    token = cursor.lastrowid
                    await conn.commit()
                except BaseException:
                    await conn.rollback()
                    raise
            finally:
                session.leave()
        return int(token)

    async def _used(self, session: Session, record: Hold, permits: int) -> int:
        """How many of the first ``permits`` slots another session holds (in ``session``'s turn)."""
        keys = slot_keys(self._prefix, record.ref.name, permits)
        cursor = session.cursor
        await cursor.execute(self._sql.slots("check", len(keys)), keys)
        row = await cursor.fetchone()
        return int(row[0] if row is not None else 0)

    async def _refuse_if_used(self, session: Session, record: Hold, recorded: int) -> None:
        """ValueError if the recorded number of permits is in use (no slot was taken: nothing to undo)."""
        requests = self._requests
        keys = slot_keys(self._prefix, record.ref.name, recorded)
        rows, _n, _id = await requests.execute(session, self._sql.slots("check", len(keys)), keys, record.ttl)
        self._raise_if_used(int(rows[0][0]), record, recorded)

    @staticmethod
    def _raise_if_used(used: int, record: Hold, recorded: int) -> None:
        if used:
            raise ValueError(
                f"semaphore {record.ref.name!r} is held with permits={recorded} by other clients; this one asks"
                f" for permits={record.ref.permits}: every client of a semaphore must use the same number"
            )

    # -- waiting (the Taker of the lines) -------------------------------------------------

    async def wait_take(self, session: Session, key: str, head: Hold, chunk: float) -> int | None:
        statement = waiting(head.state.marker, WAIT)
        try:
            rows, _n, _id = await self._requests.execute(session, statement, (key, chunk), head.ttl, wait=chunk)
        except LockError as exc:
            if interrupted(exc):
                return None
            raise
        if rows[0][0] != 1:
            return None
        return await self._count(session, key, head, head)

    async def hand(self, session: Session, key: str, record: Hold, head: Hold) -> None:
        await self._grants.hand(session, key, record, head)

    async def let_go(self, session: Session, key: str, head: Hold) -> None:
        await self._grants.let_go(session, key, head)

    # -- releasing ------------------------------------------------------------------------

    async def release(self, record: Hold) -> bool:
        """Give ``record``'s permit up (or take it out of the line); True only if it held one."""
        state = record.state
        await state.enter()
        try:
            if not record.granted:
                self._lines.leave(record)
                return False
            record.granted = False
            record.released = True
            session = record.session
            assert session is not None
            state.holders.pop(record.hold, None)
            session.holds.discard(record)
            if record.lost or session.gone:
                return False
            try:
                rows, _n, _id = await self._requests.execute(session, RELEASE, (record.key,), record.ttl)
                return bool(rows[0][0] == 1)
            finally:
                if not session.holds and not session.waiting:
                    self._sessions.used(session)
        finally:
            state.leave()
