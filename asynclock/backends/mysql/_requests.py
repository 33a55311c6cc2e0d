"""A statement on a session: in the session's turn, watched, with its errors at the edge.

The driver reads a reply in the task that sent its request, and closes the
connection when that task is cancelled mid-read (a cancelled read would put
the next reply out of step). A session holds the locks of many holds, so a
cancelled caller must never reach a read: every request the backend sends
for a caller runs in a task of its own (:meth:`Requests.spawn`), which the
caller awaits shielded. Cut short, the caller leaves the request to finish
and the task to record its outcome (a lock taken is then the hold's, and
its release follows: see ``_grants``).

A request that the server does not answer within its bound (a request
window, more for a wait in ``GET_LOCK``) closes its session, which fails
the request; a session whose connection closed is lost, with its holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..._errors import LockError
from ..._timing import request_window
from ._errors import CLIENT_ERRORS, CONNECTION_LOST, Translation, code
from ._hold import Session
from ._sessions import Sessions
from ._sql import Statements

__all__ = ["Reply", "Requests", "session_ended"]

#: A statement's rows, affected rows, and last insert id (a token, where the statement gives one).
Reply = tuple[tuple[Any, ...], int, int]

T = TypeVar("T")


def session_ended(exc: BaseException) -> bool:
    """Whether ``exc`` says the session's connection is gone (else the server answered with an error)."""
    number = code(exc)
    if number is not None and number < 2000 and number not in CONNECTION_LOST:
        return False  # the server's own error: the session lives on
    return isinstance(exc, CLIENT_ERRORS)


class Requests:
    """The statements of one backend's holds and waiters on their sessions."""

    def __init__(self, sessions: Sessions, errors: Translation, sql: Statements) -> None:
        self.sessions = sessions
        self.errors = errors
        self.sql = sql
        self.loop = sessions.loop
        #: the tasks of requests in flight (kept: the loop holds tasks weakly)
        self._running: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Run ``coro`` in a task of its own; what it returns comes in the future returned here.

        A caller cancelled while awaiting the future cancels only the future:
        the task runs on (and its outcome is recorded where it matters). The
        task sets the future itself, so the caller wakes one loop turn after the
        reply (``asyncio.shield`` would take one more).
        """
        return self.start(coro)[1]

    def start(self, coro: Coroutine[Any, Any, T]) -> tuple[asyncio.Task[None], asyncio.Future[T]]:
        """``spawn``, and the task too (which whoever must wait for the outcome awaits)."""
        done: asyncio.Future[T] = self.loop.create_future()
        task = self.loop.create_task(_drive(coro, done))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task, done

    async def execute(self, session: Session, statement: str, args: Any, ttl: float, *, wait: float = 0.0) -> Reply:
        """``statement`` with ``args`` on ``session``, in its turn; unanswered within ``wait`` seconds
        and a request window of ``ttl``, the session is closed. Run in a task of its own (``spawn``)."""
        if session.busy:
            await session.enter()
        else:
            session.busy = True  # (its turn at once: no await on the common path)
        sessions = self.sessions
        try:
            if session.killing is not None:
                await asyncio.shield(session.killing)  # (the KILL QUERY meant for its wait goes first)
            if session.gone:
                raise self.errors.unavailable("the session closed")
            session.used_at = now = self.loop.time()
            deadline = now + wait + request_window(ttl)
            inflight = sessions.inflight
            inflight[session] = deadline
            if deadline < sessions.watch_at:
                sessions.watch(deadline)
            try:
                cursor = session.cursor
                affected = await cursor.execute(statement, args)
                rows = await cursor.fetchall()
                return rows, affected, cursor.lastrowid
            except asyncio.CancelledError:
                # (only the backend's own tasks are cancelled here, when closing: the driver
                # closes a connection whose read was cut short)
                sessions.lost(session)
                raise
            finally:
                inflight.pop(session, None)
        except CLIENT_ERRORS as exc:
            raise self._failed(session, exc) from exc
        finally:
            session.leave()

    def _failed(self, session: Session, exc: BaseException) -> BaseException:
        """What a failed request raises; a session whose connection is gone is lost, with its holds."""
        if session_ended(exc):
            silent = session.silent
            self.sessions.lost(session)
            if silent:
                # A wait ends here rather than retrying against a server that went silent.
                error = self.errors.unavailable("stopped answering (the session is closed)")
                error.retryable = False
                return error
        translated = self.errors.translate(exc)
        if translated is exc and not isinstance(exc, LockError):
            return LockError(self.errors.mask(f"MySQL at {self.errors.address}: {exc!r}"))
        return translated

    async def kill_query(self, session: Session, ttl: float) -> bool:
        """End the statement ``session`` runs (its wait in ``GET_LOCK``) from another session: True if
        the server took the KILL (the statement then ends without the lock, or with it if it came first)."""
        other = await self.sessions.get(ttl)
        if other is session:
            return False
        try:
            await self.execute(other, "KILL QUERY %s", (session.id,), ttl)
        except LockError:
            return False
        finally:
            if not other.holds and not other.waiting:
                self.sessions.used(other)
        return True


async def _drive(coro: Coroutine[Any, Any, T], done: asyncio.Future[T]) -> None:
    """Run ``coro`` and hand its outcome to ``done``, unless whoever waited for it gave up."""
    try:
        result = await coro
    except BaseException as exc:
        if not done.done():
            if isinstance(exc, asyncio.CancelledError):
                done.cancel()
            else:
                done.set_exception(exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return
    if not done.done():
        done.set_result(result)
