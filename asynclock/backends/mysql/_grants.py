"""The plain lock (the fair lock is the same), and an election's candidates.

A hold takes its key on a session shared with other holds of its client,
with its token, in one statement (``_sql.TAKE``), unless its client knows
the key is busy: another owner of the client holds it (the server would let
the session in again: MySQL counts a session's locks of one name), or
waiters of the client are in line (a newcomer, even with ``timeout=0``,
never jumps the line; the server's own queue is FIFO, and grants a released
key to its first waiter within the release, so nobody jumps it there
either). A release is one statement on the session that holds the key.

An election's candidate takes the election's key (``TAKE_ELECTION``: the
identity and the term's start go in the key's row), then its term key, on a
session without other holds (the term key may have to wait a moment for
observers, which take it for an instant when a term ends: see
``_election``). A leader's row is live while one session holds both keys.
"""

from __future__ import annotations

import contextlib

from ..._errors import LockError
from ...abc import Acquired
from ._hold import Hold, Session
from ._lines import Lines
from ._requests import Reply, Requests
from ._sessions import Sessions
from ._sql import RELEASE, RELEASE_TERM, SET_TIMEOUT, SETTLE, TERM, waiting

__all__ = ["Grants", "interrupted", "owner_of"]

#: The server's error for a statement ended by KILL QUERY.
_INTERRUPTED = 1317


#: The longest owner id written in a row (a longer one, from a task's long name, is cut).
OWNER_MAX = 1024


def owner_of(hold: str) -> str:
    """The owner id of a hold id (``<client id>:<owner>``, what ``info().owner`` shows)."""
    return hold.rpartition(":")[0][:OWNER_MAX]


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement ended by KILL QUERY (meant for the wait that ran before it)."""
    cause = exc.__cause__
    return bool(cause is not None and cause.args and cause.args[0] == _INTERRUPTED)


class Grants:
    """Requests of plain locks and election candidates, and their waits (a ``_lines.Taker``)."""

    def __init__(self, requests: Requests, lines: Lines) -> None:
        self._requests = requests
        self._sessions: Sessions = requests.sessions
        self._lines = lines
        self._sql = requests.sql

    # -- taking ---------------------------------------------------------------------------

    async def try_acquire(self, record: Hold, enqueue: bool) -> Acquired | None:
        """Take the lock at once (Acquired), else None; with ``enqueue`` the hold is in line by then.

        Runs in a task of its own (``Requests.spawn``): whatever it gets is recorded on ``record``.
        """
        state = record.state
        if state.busy:
            await state.enter()
        else:
            state.busy = True  # (its turn at once: no await on the common path)
        try:
            line = state.line
            if not (state.holders or (line is not None and line.count)):
                got = await self._try(record)
                if got is not None:
                    return got
            if enqueue:
                self._lines.join(record, self)
            return None
        finally:
            state.leave()

    async def _try(self, record: Hold) -> Acquired | None:
        ttl, key = record.ttl, record.state.key
        election = record.ref.kind == "election"
        sessions = self._sessions
        if election:
            session = await sessions.for_waiting(ttl)  # (no other hold waits behind its term key)
        else:
            session = sessions.idle_session() or await sessions.get(ttl)
        try:
            await self.ensure_timeout(session, ttl)
            if election:
                identity = record.ref.identity or ""
                args = (key, record.ref.name, identity, key, 0, identity)
                _rows, taken, token = await self._take(session, self._sql.take_election, args, record)
                if taken:
                    await self._term(session, record)
            else:
                owner = owner_of(record.hold)
                args = (key, record.ref.name, owner, key, 0, owner)
                _rows, taken, token = await self._take(session, self._sql.take, args, record)
        finally:
            if election:
                sessions.done_waiting(session)
            elif not session.holds:
                sessions.used(session)
        if not taken:
            return None
        self.hold_on(record, session, key, token)
        return Acquired(token)

    async def _take(
        self, session: Session, statement: str, args: tuple[object, ...], record: Hold, wait: float = 0.0
    ) -> Reply:
        """A take statement for ``record``'s key on ``session``, waiting up to ``wait`` seconds; if it
        fails, whatever its GET_LOCK took before the error is let go of (the session held no lock
        of the key before)."""
        try:
            return await self._requests.execute(session, statement, args, record.ttl, wait=wait)
        except LockError:
            if not session.gone:
                with contextlib.suppress(LockError):
                    key = record.state.key
                    await self._retry_interrupted(session, SETTLE, (key, key), record.ttl)
            raise

    async def _term(self, session: Session, record: Hold) -> None:
        """Take the term key of ``record``'s election (its key just taken on ``session``); let go
        of both if that fails."""
        term, ttl = record.state.term, record.ttl
        assert term is not None
        try:
            rows, _taken, _id = await self._requests.execute(session, TERM, (term, ttl), ttl, wait=ttl)
            if rows[0][0] != 1:
                raise self._requests.errors.unavailable("the election's term key stayed taken")
        except BaseException:
            if not session.gone:
                await self.let_go(session, record.state.key, record)
            raise
        record.term = term

    async def ensure_timeout(self, session: Session, ttl: float) -> None:
        """Raise ``session``'s wait_timeout to ``ttl`` (whole seconds) before it holds for that long."""
        timeout = self._sessions.timeout_for(session, ttl)
        if timeout is not None:
            await self._requests.execute(session, SET_TIMEOUT, (timeout,), ttl)
            session.timeout = timeout

    def hold_on(self, record: Hold, session: Session, key: str, token: int) -> None:
        record.granted = True
        record.session = session
        record.key = key
        record.token = token
        record.state.holders[record.hold] = record
        session.holds.add(record)

    # -- waiting (the Taker of the lines) -------------------------------------------------

    async def wait_take(self, session: Session, key: str, head: Hold, chunk: float) -> int | None:
        state = head.state
        if head.ref.kind == "election":
            identity = head.ref.identity or ""
            statement = waiting(state.marker, self._sql.take_election)
            args: tuple[object, ...] = (key, head.ref.name, identity, key, chunk, identity)
        else:
            owner = owner_of(head.hold)
            statement = waiting(state.marker, self._sql.take)
            args = (key, head.ref.name, owner, key, chunk, owner)
        try:
            _rows, taken, token = await self._take(session, statement, args, head, chunk)
        except LockError as exc:
            if interrupted(exc):
                return None  # (KILL QUERY: nobody waits any more; what it may have taken is let go of)
            raise
        if not taken:
            return None
        if head.ref.kind == "election":
            await self._term(session, head)
        return token

    async def hand(self, session: Session, key: str, record: Hold, head: Hold) -> None:
        ttl = record.ttl
        if record is not head:
            record.term, head.term = head.term, None
            owner = (record.ref.identity or "") if record.ref.kind == "election" else owner_of(record.hold)
            await self._retry_interrupted(session, self._sql.owner, (owner, key), ttl)
        else:
            pinged = await self._sessions.ping(session, ttl)
            if pinged is not True:
                raise pinged if isinstance(pinged, BaseException) else self._requests.errors.unavailable("closed")

    async def let_go(self, session: Session, key: str, head: Hold) -> None:
        term = head.state.term
        if term is not None:
            await self._retry_interrupted(session, RELEASE_TERM, (term, key), head.ttl)
        else:
            await self._retry_interrupted(session, RELEASE, (key,), head.ttl)

    async def _retry_interrupted(self, session: Session, statement: str, args: tuple[object, ...], ttl: float) -> None:
        """``statement`` on ``session``, sent again if a KILL QUERY meant for a wait before it ended it."""
        for attempt in range(3):
            try:
                await self._requests.execute(session, statement, args, ttl)
                return
            except LockError as exc:
                if attempt == 2 or not interrupted(exc):
                    raise

    # -- releasing ------------------------------------------------------------------------

    async def release(self, record: Hold) -> bool:
        """Give ``record`` up (or take it out of the line); True only if it held the lock.
        Runs in a task of its own."""
        state = record.state
        if state.busy:
            await state.enter()
        else:
            state.busy = True  # (its turn at once: no await on the common path)
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
                if record.term is not None:
                    rows, _n, _id = await self._requests.execute(
                        session, RELEASE_TERM, (record.term, record.key), record.ttl
                    )
                    return bool(rows[0][1] == 1)
                rows, _n, _id = await self._requests.execute(session, RELEASE, (record.key,), record.ttl)
                return bool(rows[0][0] == 1)
            finally:
                if not session.holds and not session.waiting:
                    self._sessions.used(session)
        finally:
            state.leave()
