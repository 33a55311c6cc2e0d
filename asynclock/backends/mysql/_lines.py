"""Waiting without polling: a line of local waiters per key, and a session waiting in the server for them.

MySQL has no notifications; its wait is ``GET_LOCK(key, timeout)`` itself,
which blocks in the server until the key is free and takes it then, in the
order the sessions asked (the server grants a released key to its first
waiter within the release). So a client's waiters of one key form a line
(FIFO) here, and one session of the client waits in the server for the
whole line (:meth:`Lines._wait_on`): a thousand local waiters of one key
cost one connection, and a release by anybody wakes the line at once. When
that session is granted the key, the first waiter still in line gets it (a
waiter that left meanwhile is skipped), after one round trip that proves the
session alive from then on (a ping, or the statement that names the new
holder); the session now holds the lock, and the line waits on another.

A semaphore's line waits on each of its slot keys at once (a session per
slot): the first slot released goes to the first waiter, the next to the
next. Statements wait the line's longest ttl (between 1 s and ``CHUNK``) and
are sent again while the line is not empty, so that a server that stops
answering is found out: the waiters then raise BackendUnavailable.

A waiter that leaves (its caller gave up, or was cancelled) leaves the line
at once; when nobody is left, the waits are ended with ``KILL QUERY`` from
another session (a key granted meanwhile is let go of), so the server's own
queue has no leftover waiter ahead of other clients'. A wait that fails
(the session closed, the server went away) wakes every waiter of the line
with the error; the front retries, which starts the wait again.
"""

from __future__ import annotations

import asyncio

from ..._errors import LockError
from ...abc import Acquired, Queued
from .._background import Background
from ._hold import Hold, KeyState, Line, Session, Taker, first_waiting
from ._requests import Requests
from ._sql import SET_TIMEOUT

__all__ = ["CHUNK", "Lines", "chunk"]

#: The longest a statement waits in GET_LOCK before it is sent again, in seconds: the line's
#: longest ttl, between 1 and this. (A server that stops answering is found out after that and a
#: request window: a blocked GET_LOCK cannot be told from a silent server before.)
CHUNK = 30.0


def chunk(ttl: float) -> float:
    """How long one wait statement of a line whose longest ttl is ``ttl`` waits in the server."""
    return min(max(ttl, 1.0), CHUNK)


class Lines:
    """The lines of one backend."""

    def __init__(self, requests: Requests, background: Background) -> None:
        self._requests = requests
        self._sessions = requests.sessions
        self._background = background
        self.loop = requests.loop
        self.closed = False

    # -- waiters ----------------------------------------------------------------------

    def join(self, record: Hold, taker: Taker) -> None:
        """Put ``record`` at the end of its key's line (the caller has the key's turn)."""
        state = record.state
        line = state.line
        if line is None:
            line = state.line = Line(taker)
        record.queued = True
        record.granted_at = self.loop.create_future()
        line.waiters.append(record)
        line.count += 1
        self._start(state, line)

    async def wait(self, record: Hold, until: float | None) -> Acquired | Queued:
        """Wait for ``record``'s grant, at most until the loop time ``until``.

        A wait that failed (its session closed, the server went away) raises
        its error here once; the next call waits again (``record`` is still in line).
        """
        line = record.state.line
        granted = record.granted_at
        if granted is None or line is None:
            raise self._requests.errors.unavailable("the backend is closed")
        if not granted.done():
            self._start(record.state, line)
            timeout = None if until is None else max(0.0, until - self.loop.time())
            await asyncio.wait((granted,), timeout=timeout)  # (never cancels ``granted``)
            if not granted.done():
                return Queued(None)
        if granted.cancelled():
            raise self._requests.errors.unavailable("the wait was given up")
        error = granted.exception()
        if error is not None:
            if record.queued:
                record.granted_at = self.loop.create_future()  # (the next call waits again)
            raise error
        return Acquired(record.token, confirmed_at=granted.result())

    def leave(self, record: Hold) -> None:
        """Take ``record`` out of its line (not granted); the last to leave ends the line's waits."""
        if not record.queued:
            return
        record.queued = False
        line = record.state.line
        if line is None:
            return
        line.count -= 1
        granted = record.granted_at
        if granted is not None:
            if not granted.done():
                granted.cancel()
            elif not granted.cancelled():
                granted.exception()  # (retrieved: a failure nobody waits for any more)
        if line.count <= 0:
            self._end_waits(line)
        self._forget(record.state)

    def _end_waits(self, line: Line) -> None:
        """Nobody is left in ``line``: end its waits in the server (a semaphore's on its other slots too)."""
        line.waiters.clear()
        for task, sessions in line.waits.values():
            for session in sessions:
                if session.waiting and session.busy and not session.gone:
                    self._background.spawn(self._end_wait(session, task, line))

    async def _end_wait(self, session: Session, task: asyncio.Task[None], line: Line) -> None:
        """End the wait ``session`` is in (KILL QUERY) if nobody joined the line meanwhile; when that
        cannot be done, close the session. Until the server took the KILL, the session's next
        statements wait (a KILL QUERY ends whatever statement runs when it arrives)."""
        if task.done() or line.count > 0 or not (session.waiting and session.busy) or session.gone:
            return
        killing = session.killing = self.loop.create_future()
        try:
            killed = await self._requests.kill_query(session, 1.0)
        except LockError:
            killed = False
        finally:
            session.killing = None
            killing.set_result(None)
        if not killed and not task.done():
            self._sessions.lost(session)

    # -- waiting in the server ------------------------------------------------------------

    def _start(self, state: KeyState, line: Line) -> None:
        """Start a wait on each of the line's keys that has none (a lock: its key; a semaphore: its slots)."""
        if self.closed:
            return
        for key in state.slots or (state.key,):
            if key not in line.waits:
                sessions: list[Session] = []
                task = self._background.spawn(self._wait_on(state, line, key, sessions))
                line.waits[key] = (task, sessions)

    async def _wait_on(self, state: KeyState, line: Line, key: str, current: list[Session]) -> None:
        """Wait in the server for ``key`` on a session of its own, for as long as ``line`` has waiters;
        hand each grant to the first waiter. ``current`` names the session waiting now."""
        sessions, taker = self._sessions, line.taker
        session: Session | None = None
        try:
            while not self.closed:
                head = first_waiting(line.waiters)
                if head is None:
                    break
                ttl = max(record.ttl for record in line.waiters if record.queued)
                if session is None:
                    session = await sessions.for_waiting(ttl)
                    current[:] = [session]
                timeout = sessions.timeout_for(session, ttl)
                if timeout is not None:
                    await self._requests.execute(session, SET_TIMEOUT, (timeout,), ttl)
                    session.timeout = timeout
                try:
                    token = await taker.wait_take(session, key, head, chunk(ttl))
                except ValueError as exc:  # for ``head`` alone: it leaves the line with it
                    self._fail_one(head, exc)
                    continue
                if token is None:
                    continue
                record = first_waiting(line.waiters)
                if record is None:
                    await taker.let_go(session, key, head)
                    continue
                sent = self.loop.time()
                try:
                    await taker.hand(session, key, record, head)
                except BaseException:
                    if not session.gone:
                        await taker.let_go(session, key, head)
                    raise
                if not record.queued:  # (it left while its grant was being made)
                    await taker.let_go(session, key, head)
                    continue
                self._grant(record, session, key, token, sent)
                session = None
                current.clear()
        except Exception as exc:  # noqa: BLE001 - the waiters raise it
            self._fail_all(line, exc)
        finally:
            line.waits.pop(key, None)
            current.clear()
            if session is not None and not session.gone:
                sessions.done_waiting(session)
            if not self.closed and any(_waiting(record) for record in line.waiters):
                self._start(state, line)  # (a waiter joined as this wait was ending)
            self._forget(state)

    def _grant(self, record: Hold, session: Session, key: str, token: int, sent: float) -> None:
        line = record.state.line
        record.queued = False
        session.waiting = False
        if line is not None:
            line.count -= 1
            if line.waiters and line.waiters[0] is record:
                line.waiters.popleft()
            if line.count <= 0:
                self._end_waits(line)  # (a semaphore's waits on its other slots)
        record.granted = True
        record.session = session
        record.key = key
        record.token = token
        record.state.holders[record.hold] = record
        session.holds.add(record)
        if record.granted_at is not None and not record.granted_at.done():
            record.granted_at.set_result(sent)

    def _fail_one(self, record: Hold, exc: BaseException) -> None:
        line = record.state.line
        if not record.queued or line is None:
            return
        record.queued = False
        line.count -= 1
        _fail(record.granted_at, exc)

    def _fail_all(self, line: Line, exc: BaseException) -> None:
        """The line's wait failed: every waiter is told (each stays in line; the front calls again)."""
        for record in line.waiters:
            if record.queued:
                _fail(record.granted_at, exc)

    def _forget(self, state: KeyState) -> None:
        line = state.line
        if line is not None and not line.active:
            state.line = None

    def close(self) -> None:
        """No wait starts any more (the backend closes its sessions, which ends those in flight)."""
        self.closed = True


def _waiting(record: Hold) -> bool:
    """Whether ``record`` waits in line for a grant that nobody has answered yet."""
    return record.queued and record.granted_at is not None and not record.granted_at.done()


def _fail(granted: asyncio.Future[float] | None, exc: BaseException) -> None:
    """Make ``granted`` raise ``exc`` for the waiter's next look (not reported if it never looks again)."""
    if granted is not None and not granted.done():
        granted.set_exception(exc)
        granted.exception()  # (marked retrieved: a waiter that left meanwhile has nothing to be told)
