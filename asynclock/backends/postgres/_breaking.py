"""Breaking a lock (``locks.break_lock``) on PostgreSQL, from both ends.

A hold is an advisory lock of the holder's session, and only that session
can let go of it. So the breaking client asks the holder's client, on its
channel, to give the hold up (``b <asker> <request> <k1> <k2> <pid> <name
check>``): that client loses the hold at once (its body is cancelled), lets
go of the advisory lock, which wakes the first waiter, and answers
(``k <request> <outcome>``: ``y`` done, ``n`` it holds nothing of that
name on that session, ``f`` it could not let go). A hold of the breaking
client itself is given up the same way, without a message.

When the holder's client does not answer within :data:`BREAK_TIMEOUT`, could
not let go, or the session is not asynclock's at all, the holder's session
is ended (``pg_terminate_backend``): that releases every lock the session
holds, and the client of each hold on it loses its lease. Then the first
waiter is told to try. Tokens come from the sequence: the next holder's is
larger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg

from ..._errors import ConfigurationError
from ..._values import LockInfo
from ...abc import LockRef
from .._background import Background
from ._grants import Grants
from ._hold import Hold, KeyState
from ._inspect import Holder, Inspector, describe
from ._keys import Key, channel, name_check
from ._listener import Listener
from ._sql import NOTIFY_EACH, Statements

__all__ = ["BREAK_TIMEOUT", "BROKEN", "Breaker"]

logger = logging.getLogger("asynclock")

#: How long the breaking client waits for the holder's client to give the hold up, in seconds.
BREAK_TIMEOUT = 2.0
#: How long it waits for a session it ended to be gone, before it tells the first waiter anyway.
END_TIMEOUT = 5.0
#: What the holder's ``LockLost`` says.
BROKEN = "the lock was broken (force-released by locks.break_lock or asynclock break)"

#: How often it looks whether that session is gone, in seconds.
_LOOK = 0.02

_TERMINATE = "SELECT pg_terminate_backend($1)"
_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"


class Breaker:
    """``break_lock`` of one backend, and its answers to other clients that break a lock it holds.

    ``lose(holds, reason)``: these holds of this client are lost now (their bodies cancelled).
    """

    def __init__(
        self,
        inspector: Inspector,
        listener: Listener,
        keys: dict[Key, KeyState],
        grants: Grants,
        forget: Callable[[Hold], None],
        sql: Statements,
        prefix: str,
        background: Background,
        lose: Callable[[list[str], str], None],
    ) -> None:
        self._inspector = inspector
        self._listener = listener
        self._keys = keys
        self._grants = grants
        self._forget = forget
        self._sql = sql
        self._prefix = prefix
        self._background = background
        self._lose = lose
        # request id -> the holder's client's answer
        self._asked: dict[str, asyncio.Future[str]] = {}

    # -- the breaking client -----------------------------------------------------------

    async def break_lock(self, ref: LockRef, main: Key, key_name: str, owner: str | None) -> LockInfo | None:
        """Take the plain lock of ``main`` from its holder (only ``owner``'s hold, if given); what it broke,
        or None (free, another owner's, or let go of meanwhile)."""
        check = name_check(self._prefix, ref.name)
        holders, waiters = await self._inspector.holders(ref, main, [main])
        if not holders or (owner is not None and holders[0].hold != owner):
            return None
        holder = holders[0]
        if holder.mine:
            outcome = await self.give_up(main, holder.pid, check)
        elif holder.backend is not None:
            outcome = await self._ask(holder, main, check)
        else:
            outcome = "?"  # not a session of asynclock's: nobody to ask
        if outcome == "n":
            return None  # it let go meanwhile
        if outcome != "y":
            await self._end_session(holder, main)
        return describe(ref, key_name, holders, waiters)

    async def _ask(self, holder: Holder, key: Key, check: str) -> str:
        """Ask the holder's client to give its hold up; its answer, or ``?`` if none came in time."""
        listener = self._listener
        request = secrets.token_hex(4)
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._asked[request] = answer
        payload = f"b {listener.backend} {request} {key[0]} {key[1]} {holder.pid} {check}"
        target = [channel(holder.backend or "")]
        try:
            await listener.statement(lambda conn: conn.fetchval(NOTIFY_EACH, target, payload))
            async with asyncio.timeout(BREAK_TIMEOUT):
                return await answer
        except TimeoutError:
            return "?"
        finally:
            del self._asked[request]

    def answered(self, text: str) -> None:
        """The holder's client answered (``<request> <outcome>``)."""
        request, _, outcome = text.partition(" ")
        answer = self._asked.get(request)
        if answer is not None and not answer.done():
            answer.set_result(outcome)

    async def _end_session(self, holder: Holder, key: Key) -> None:
        """End the holder's session (every lock it holds goes with it), then tell the first waiter to try."""
        logger.warning(
            "breaking a PostgreSQL lock: ending the session (pid %d) of its holder %s, and with it every lock"
            " that session holds",
            holder.pid,
            holder.hold,
        )

        async def terminate(conn: Any) -> Any:
            try:
                return await conn.fetchval(_TERMINATE, holder.pid)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise ConfigurationError(
                    f"PostgreSQL refused to end the session (pid {holder.pid}) that holds the lock: {exc}; the"
                    " role needs to be the holder's role, or a member of pg_signal_backend"
                ) from exc

        listener = self._listener
        await listener.statement(terminate)
        for _ in range(round(END_TIMEOUT / _LOOK)):  # (the session ends a moment after the signal)
            if not await listener.statement(lambda conn: conn.fetchval(_ALIVE, holder.pid)):
                break
            await asyncio.sleep(_LOOK)
        # (a session's end tells nobody: the first waiter would find out at its next look)
        await listener.statement(lambda conn: conn.fetchval(self._sql.wake, *key, -1, None, None))

    # -- the holding client ------------------------------------------------------------

    def asked(self, text: str) -> None:
        """Another client breaks a lock (``<asker> <request> <k1> <k2> <pid> <name check>``): give up
        this client's hold of it, if it has one, and answer."""
        try:
            asker, request, k1, k2, pid, check = text.split(" ")
            key, session = (int(k1), int(k2)), int(pid)
        except ValueError:
            return

        async def answer() -> None:
            outcome = await self.give_up(key, session, check)
            payload = f"k {request} {outcome}"
            target = [channel(asker)]
            with contextlib.suppress(Exception):
                await self._listener.statement(lambda conn: conn.fetchval(NOTIFY_EACH, target, payload))

        self._background.spawn(answer())

    async def give_up(self, key: Key, pid: int, check: str) -> str:
        """Lose this client's hold of the plain lock ``key`` of the name ``check`` on the session ``pid``
        and let go of it: ``y``; ``n`` if there is none; ``f`` if letting go failed."""
        state = self._keys.get(key)
        record = None
        for candidate in state.holders.values() if state is not None else ():
            session = candidate.session
            if (
                candidate.ref.kind in ("lock", "fair")
                and candidate.granted
                and not candidate.lost
                and session is not None
                and session.pid == pid
                and name_check(self._prefix, candidate.ref.name) == check
            ):
                record = candidate
                break
        if record is None:
            return "n"
        self._lose([record.hold], BROKEN)
        try:
            await self._grants.release(record)
        except Exception:  # noqa: BLE001 (the breaking client ends the session instead)
            return "f"
        finally:
            self._forget(record)
        return "y"
