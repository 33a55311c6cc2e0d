"""Requests on a session, in the caller's task: its turn, the watch on its bound, errors at the edge.

A request cut short (cancelled, failed, past its bound) has an unknown
outcome: whatever its statement locked may still be locked. The key's
state then names the session (``KeyState.unknown``) and :meth:`settle`
finds out, from ``pg_locks``, which of the key's locks the session holds
that no hold of this client claims, and lets go of them; it runs before
the next request about the key, in the release of the hold, and in the
background right away (so a lock left by a cancelled caller goes within a
request window even when nobody asks for the key again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import asyncpg

from ..._errors import LockError, plain
from ..._timing import request_window
from .._background import Background
from ._errors import EDGE_ERRORS, Translation
from ._hold import KeyState, Session
from ._keys import Key
from ._sessions import Sessions
from ._sql import MINE, UNLOCK
from ._tokens import FLOOR, Schema, fresh_token

_fetchval = asyncpg.Connection.fetchval

__all__ = ["Requests", "waited_for_row"]

logger = logging.getLogger("asynclock")


def waited_for_row(exc: BaseException) -> bool:
    """A lock statement ended by lock_timeout: it waited for a fence row another transaction holds."""
    return isinstance(exc, LockError) and isinstance(exc.__cause__, asyncpg.LockNotAvailableError)


class Requests:
    """The statements of one backend's holds on their sessions."""

    def __init__(self, sessions: Sessions, errors: Translation, schema: Schema, background: Background) -> None:
        self.sessions = sessions
        self.errors = errors
        self.schema = schema
        self.sql = schema.sql
        self._background = background

    async def run(self, session: Session, ttl: float, method: Callable[..., Any], *args: Any) -> Any:
        """``method(statement, *args)`` of ``session.conn`` in ``session``'s turn, watched for a request window.

        ``method`` is an unbound asyncpg ``Connection`` method (``fetchval``...).
        """
        if session.busy:
            await session.enter()
        else:
            session.busy = True  # (its turn at once: no await on the common path)
        sessions = self.sessions
        try:
            session.used_at = now = sessions.loop.time()
            deadline = now + request_window(ttl)
            inflight = sessions.inflight
            inflight[session] = deadline
            if deadline < sessions.watch_at:
                sessions.watch(session, deadline)
            try:
                return await method(session.conn, *args)
            finally:
                inflight.pop(session, None)
        except EDGE_ERRORS as exc:
            translated = self.errors.translate(exc)
            if translated is exc:
                raise
            if session.silent and not isinstance(exc, AttributeError):
                # A wait ends here rather than retrying against a server that went silent.
                error = self.errors.unavailable("stopped answering (the session is closed)")
                error.retryable = False
                raise error from exc
            raise translated from exc
        finally:
            session.leave()

    async def checked_token(self, session: Session, ttl: float, token: int) -> int:
        """``token`` if it is one to hand out, else (a crash reset the sequence) a fresh one."""
        if self.schema.sequence is None or token >= FLOOR:
            return token
        await session.enter()
        try:
            async with self.errors.edge, asyncio.timeout(max(request_window(ttl), 1.0)):
                return await fresh_token(session.conn, self.sql)
        finally:
            session.leave()

    async def settle(self, state: KeyState, keys: Collection[Key], claimed: Callable[[Session, Key], bool]) -> None:
        """Let go of what a request cut short left: ``keys`` this client's sessions in ``state.unknown``
        hold but that no hold claims (``claimed(session, key)``), then wake the first waiter (a
        release cut short may not have). The caller has the key's turn."""
        while state.unknown:
            session = state.unknown[0]
            if not session.gone:
                await session.enter()
                try:
                    async with self.errors.edge, asyncio.timeout(max(request_window(session.idle or 1.0), 1.0)):
                        mine = await session.conn.fetch(MINE)
                        for row in mine:
                            key = (row["k1"], row["k2"])
                            if key in keys and not claimed(session, key):
                                await session.conn.fetchval(UNLOCK, *key, row["shared"])
                        await session.conn.fetchval(self.sql.wake, *state.key, -1, None, None)
                finally:
                    session.leave()
            state.unknown.pop(0)

    def settle_soon(self, state: KeyState, settle: Callable[[KeyState], Awaitable[None]]) -> None:
        """Run ``settle(state)`` in the key's next turn, in the background, bounded."""

        async def run() -> None:
            try:
                async with asyncio.timeout(10.0):
                    await state.enter()
                    try:
                        if state.unknown:
                            await settle(state)
                    finally:
                        state.leave()
            except Exception as exc:  # noqa: BLE001 - the server's, or ours translated: close the sessions
                logger.info("could not settle a PostgreSQL request cut short (%s); its session is closed", plain(exc))
                for session in state.unknown:
                    with contextlib.suppress(Exception):
                        session.conn.terminate()

        self._background.spawn(run())

    async def unlock(
        self,
        state: KeyState,
        session: Session,
        ttl: float,
        lock: Key,
        shared: bool,
        settle: Callable[[KeyState], Awaitable[None]],
        first: Awaitable[None] | None = None,
    ) -> bool:
        """Let go of ``lock`` (``state``'s key, or one of its slots) on ``session`` after ``first``, and
        tell the first waiter queued for the key if there is one; True if the lock was held.

        The caller has the key's turn and has taken the hold off ``session``.
        Cut short, the outcome is unknown: ``settle`` finds out in the background.
        """
        q1, q2 = state.marker
        try:
            if first is not None:
                await first
            flags = await self.run(session, ttl, _fetchval, self.sql.release, *lock, shared, q1, q2)
            if flags & 2:
                await self.run(session, ttl, _fetchval, self.sql.wake, *state.key, -1, None, None)
        except BaseException:
            state.unknown.append(session)
            self.settle_soon(state, settle)
            raise
        finally:
            if not session.holds:
                self.sessions.used(session)
        return bool(flags & 1)
