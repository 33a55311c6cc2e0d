"""The plain lock (the fair lock is the same) and the two sides of a read-write lock.

A hold takes its key on a session shared with other holds of its client,
in one statement with its token (``_sql.TRY``), unless its client knows the
key is busy: another owner of the client holds it (a session would let
itself in again: PostgreSQL's advisory locks are re-entrant per session),
or its waiters are queued. A read hold joins its client's read hold of the
key (one shared lock per client, many holds). A release is one statement
that also says whether anybody waits (then a second wakes the first).

An election's candidate is a lock of the election's key: its grant is
followed by the leader's row (``_election``), before the term begins, and
its release by the row's removal, before the key is let go of.
"""

from __future__ import annotations

import asyncio
import collections

import asyncpg

from ...abc import Acquired
from ._election import Elections
from ._hold import Hold, KeyState, Session
from ._keys import Key, fence_row
from ._listener import Listener
from ._pool import ms
from ._queue import Queue
from ._requests import Requests, waited_for_row
from ._tokens import FLOOR

__all__ = ["Grants"]

_fetchval = asyncpg.Connection.fetchval
_fetchrow = asyncpg.Connection.fetchrow

#: Names this backend has registered (written their fence row), most recent last, at most this many.
REGISTERED_MAX = 4096


class Grants:
    """Requests of locks and read-write sides."""

    def __init__(self, requests: Requests, queue: Queue, listener: Listener, elections: Elections) -> None:
        self._requests = requests
        self._elections = elections
        self._queue = queue
        self._sessions = requests.sessions
        self._listener = listener
        # Names whose fence row this backend wrote, while its listening session stays the same one:
        # a crash, which empties the (unlogged) fence table, ends that session too.
        self._registered: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._registered_in = 0

    # -- taking --------------------------------------------------------------------------

    async def try_acquire(self, record: Hold, enqueue: bool) -> Acquired | None:
        """Take the lock at once (Acquired), else None; with ``enqueue`` the hold is queued by then."""
        state = record.state
        if state.busy:
            await state.enter()
        else:
            state.busy = True  # (its turn at once: no await on the common path)
        try:
            if state.unknown:
                await self.settle(state)
            if not (state.waiting or state.conflicts(record.shared)):
                if record.shared and state.holders:
                    got = await self._join(record)
                else:
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

    async def _try(self, record: Hold) -> Acquired | None:
        state, ttl, requests = record.state, record.ttl, self._requests
        sessions = self._sessions
        session = sessions.idle_session() or await sessions.get(ttl)
        if session.idle < ttl and sessions.pg14:
            await self._raise_idle(session, ttl)
        sql = requests.sql
        k1, k2 = state.key
        q1, q2 = state.marker
        row = fence_row(record.ref)
        if self._registered_in != self._listener.incarnation:
            self._registered.clear()
            self._registered_in = self._listener.incarnation
        fast = sql.try_lock is not None and row in self._registered
        try:
            if fast:
                value = await requests.run(session, ttl, _fetchval, sql.try_lock, k1, k2, q1, q2, record.shared)
            else:
                value = await requests.run(
                    session, ttl, _fetchval, sql.try_write, k1, k2, q1, q2, record.shared, row, ms(ttl / 6)
                )
        except BaseException as exc:
            state.unknown.append(session)
            if waited_for_row(exc):
                await self.settle(state)
                return None
            requests.settle_soon(state, self.settle)
            raise
        if value > 0:
            if not fast:
                self._register(row)
            if (value < FLOOR and requests.schema.sequence is not None) or record.ref.kind == "election":
                # a crash reset the sequence, or a leader's row is to be written
                return await self._granted(record, session, value, None)
            self._hold_on(record, session, value)
            return Acquired(value)
        if value < 0:  # free, but waiters are queued: it let go again, and wakes the first
            await requests.run(session, ttl, _fetchval, sql.wake, k1, k2, -1, None, None)
        return None

    async def _join(self, record: Hold) -> Acquired | None:
        """A read hold joins its client's read hold: a token, unless waiters are queued (a writer may be among them)."""
        state, ttl, requests = record.state, record.ttl, self._requests
        sql = requests.sql
        session = state.session
        assert session is not None
        if session.idle < ttl and self._sessions.pg14:
            await self._raise_idle(session, ttl)  # (its lease counts on the group's session)
        q1, q2 = state.marker
        if sql.join is not None:
            value = await requests.run(session, ttl, _fetchval, sql.join, q1, q2)
        else:
            k1, k2 = state.key
            value = await requests.run(
                session, ttl, _fetchval, sql.join_write, k1, k2, q1, q2, fence_row(record.ref), ms(ttl / 6)
            )
        if value < 0:
            return None
        token = await requests.checked_token(session, ttl, value)
        self._hold_on(record, session, token)
        return Acquired(token)

    async def head_try(self, record: Hold) -> Acquired | None:
        """The queued ``record`` tries: granted if it is first in line and the lock is free, else None."""
        state, ttl, requests = record.state, record.ttl, self._requests
        await state.enter()
        try:
            if state.unknown:
                await self.settle(state)
            if record.granted:
                return Acquired(record.token)
            if record.ticket is None or state.conflicts(record.shared):
                return None  # (another owner of this client holds it: its release wakes this one)
            take = not (record.shared and state.holders)
            sessions = self._sessions
            if take:
                session = sessions.idle_session() or await sessions.get(ttl)
                if session.idle < ttl and sessions.pg14:
                    await self._raise_idle(session, ttl)
            else:
                assert state.session is not None
                session = state.session
                if session.idle < ttl and sessions.pg14:
                    await self._raise_idle(session, ttl)
            k1, k2 = state.key
            sent = asyncio.get_running_loop().time()
            try:
                row = await requests.run(
                    session, ttl, _fetchrow, requests.sql.head,
                    k1, k2, record.ticket, record.shared, take, fence_row(record.ref), ms(ttl / 6),
                )  # fmt: skip
            except BaseException as exc:
                if take:
                    state.unknown.append(session)
                    if waited_for_row(exc):
                        await self.settle(state)
                        return None
                    requests.settle_soon(state, self.settle)
                raise
            record.head = row["head"]
            if not row["present"]:
                record.ticket = None  # its listening session ended: it queues again
                return None
            if not row["ok"]:
                return None
            record.ticket = None  # the grant deleted the row
            self._queue.count_out(record)
            holding = session if take else state.session
            assert holding is not None
            return await self._granted(record, holding, row["token"], sent)
        finally:
            state.leave()

    async def _granted(self, record: Hold, session: Session, token: int, sent: float | None) -> Acquired:
        state = record.state
        try:
            token = await self._requests.checked_token(session, record.ttl, token)
            if record.ref.kind == "election":
                await self._elections.announce(record, session, token)
        except BaseException:
            if not state.holders:
                state.unknown.append(session)  # the lock is held, with no token to hand out
                self._requests.settle_soon(state, self.settle)
            raise
        self._hold_on(record, session, token)
        return Acquired(token, confirmed_at=sent)

    def _hold_on(self, record: Hold, session: Session, token: int) -> None:
        state = record.state
        state.session = session
        state.shared = record.shared
        state.holders[record.hold] = record
        session.holds.add(record)
        record.session = session
        record.granted = True
        record.token = token

    async def _raise_idle(self, session: Session, ttl: float) -> None:
        await session.enter()
        try:
            if session.idle < ttl:
                await self._sessions.raise_idle(session, ttl)
        finally:
            session.leave()

    def _register(self, row: bytes) -> None:
        registered = self._registered
        registered[row] = None
        registered.move_to_end(row)
        if len(registered) > REGISTERED_MAX:
            registered.popitem(last=False)

    # -- releasing -----------------------------------------------------------------------

    async def release(self, record: Hold) -> bool:
        """Give ``record`` up (or take it out of the queue); True only if it held the lock."""
        state, requests = record.state, self._requests
        if state.busy:
            await state.enter()
        else:
            state.busy = True
        try:
            if not record.granted:
                if record.marked or record.ticket is not None or record.queuing is not None:
                    await self._queue.leave(record)
                if state.unknown:
                    await self.settle(state)
                return False
            record.granted = False
            record.released = True
            session = record.session
            assert session is not None
            state.holders.pop(record.hold, None)
            session.holds.discard(record)
            if record.lost:
                return False
            if state.holders:
                return True  # the other read holds of this client keep the shared lock
            state.session = None
            retire = self._elections.retire(record, session) if record.term is not None else None
            return await requests.unlock(state, session, record.ttl, state.key, record.shared, self.settle, retire)
        finally:
            state.leave()

    # -- requests cut short ------------------------------------------------------------------

    async def settle(self, state: KeyState) -> None:
        """Let go of what requests cut short left on ``state.unknown`` (the caller has the key's turn):
        the key, and an election's term keys that no leader of this client claims."""
        keys: set[Key] = {state.key, *state.terms}

        def claimed(session: Session, key: Key) -> bool:
            if state.session is not session or not state.holders:
                return False
            return key == state.key or any(record.term == key for record in state.holders.values())

        await self._requests.settle(state, keys, claimed)
        if state.terms:
            state.terms = {record.term for record in state.holders.values() if record.term is not None}

    def forget(self, record: Hold) -> None:
        """``record``'s session ended: it holds nothing any more."""
        state = record.state
        record.lost = True
        state.holders.pop(record.hold, None)
        if state.session is record.session and not state.holders:
            state.session = None
