"""The parts of a started backend, built once its set-up has read the server and made the tables.

Everything here needs what the set-up found (:class:`~._tokens.Schema`: the
statements, the tables' names, what the server can do), so it is made after
it, complete: the sessions of the holds, their requests, the queue, the
primitives (``Grants``: locks and read-write locks, elections among them;
``Permits``: semaphores), and ``info``'s inspector. They share the records
of this client's holds (``holds``, by hold id) and of the keys it asks for
(``keys``), kept here along with what happens to them when a session or
the listening session ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from ..._timing import request_window
from ..._values import LockInfo, LossReason
from ...abc import LockRef, RenewItem
from ._breaking import Breaker
from ._election import Elections
from ._errors import Translation
from ._grants import Grants
from ._hold import Hold, KeyState, Session
from ._inspect import Inspector
from ._keys import Key, slot_arrays
from ._listener import Listener
from ._pool import Pool
from ._queue import Queue
from ._requests import Requests
from ._semaphore import Permits
from ._sessions import Sessions
from ._tokens import Schema

__all__ = ["KEYS_KEPT", "Lose", "Running"]

#: States of keys kept while nothing is on them (a key taken again soon needs no new one).
KEYS_KEPT = 1024


class Lose(Protocol):
    """How the backend tells its client that holds are lost now: by default, their session closed."""

    def __call__(self, holds: list[str], reason: str = ..., loss: LossReason = ...) -> None: ...


class Running:
    """A started backend's parts and the records they share.

    ``lose(holds)``: these holds are lost (their session closed); the backend tells its client.
    """

    def __init__(
        self,
        schema: Schema,
        pool: Pool,
        listener: Listener,
        errors: Translation,
        *,
        backend: str,
        prefix: str,
        lose: Lose,
    ) -> None:
        self._prefix = prefix
        self._lose = lose
        # What this client asks for, by key, and every acquisition from its first request to its end.
        self.keys: dict[Key, KeyState] = {}
        self.holds: dict[str, Hold] = {}
        background = pool.background
        self.listener = listener
        self.sessions = Sessions(
            pool, errors, pg14=schema.pg14, backend=backend, on_lost=self._session_lost, waiters=self._waiters
        )
        self.requests = Requests(self.sessions, errors, schema, background)
        self.queue = Queue(schema, listener, background)
        self.elections = Elections(self.requests, listener, background, prefix)
        self.grants = Grants(self.requests, self.queue, listener, self.elections)
        self.permits = Permits(self.requests, self.queue, listener, prefix)
        self.inspector = Inspector(listener, self.sessions, self.keys, prefix, schema.sql, background)
        self.breaker = Breaker(
            self.inspector,
            listener,
            self.keys,
            self.grants,
            self.forget,
            schema.sql,
            prefix,
            background,
            lambda holds, reason: lose(holds, reason, LossReason.TAKEN_OR_EXPIRED),
        )

    def _waiters(self) -> bool:
        return self.queue.waiting > 0

    def state(self, ref: LockRef, key: Key) -> KeyState:
        """The state of ``key``, the main key of ``ref`` (a semaphore's: its gate, with its slots)."""
        state = self.keys.get(key)
        if state is None or (ref.kind == "semaphore" and len(state.slots) != ref.permits and state.idle):
            slots: frozenset[Key] = frozenset()
            if ref.kind == "semaphore":
                highs, lows = slot_arrays(self._prefix, ref.name, ref.permits)
                slots = frozenset(zip(highs, lows, strict=True))
            state = self.keys[key] = KeyState(key, slots)
        return state

    async def info(self, ref: LockRef, main: Key, key_name: str) -> LockInfo:
        """What the server and the holders' clients say about ``ref``, whose main key is ``main``
        (a semaphore's holders hold its slots)."""
        if ref.kind == "semaphore":
            highs, lows = slot_arrays(self._prefix, ref.name, ref.permits)
            held = list(zip(highs, lows, strict=True))
        else:
            held = [main]
        return await self.inspector.info(ref, main, held, key_name)

    # -- news -------------------------------------------------------------------------

    def message(self, payload: str) -> None:
        """A notification on this backend's channel."""
        kind, _, rest = payload.partition(" ")
        if kind in ("t", "h"):
            record = self.holds.get(rest)
            if record is not None and not record.granted and record.woken is not None:
                if kind == "t":
                    record.try_now = True
                else:
                    record.head = True
                record.woken.set()
        elif kind == "i":
            self.inspector.asked(rest)
        elif kind == "r":
            self.inspector.answered(rest)
        elif kind == "b":
            self.breaker.asked(rest)
        elif kind == "k":
            self.breaker.answered(rest)

    def listener_lost(self) -> None:
        """The listening session ended: its waiters' rows are dead; they queue again."""
        for record in self.holds.values():
            if record.woken is not None and not record.granted:
                record.woken.set()
        self.elections.wake_all()

    def _session_lost(self, session: Session) -> None:
        """A session closed: exactly its holds are lost."""
        lost = [record for record in session.holds if record.granted and not record.lost]
        for record in session.holds:
            self.grants.forget(record)
        session.holds.clear()
        for state in self.keys.values():
            if session in state.unknown:
                state.unknown.remove(session)  # its locks ended with it
        if lost:
            self._lose([record.hold for record in lost])
        leaders = [record for record in lost if record.ref.kind == "election"]
        if leaders:
            self.elections.lost(leaders)

    # -- the end of a hold ------------------------------------------------------------

    async def end(self, record: Hold) -> None:
        """``record`` is over: out of the queue, its permits key let go of, forgotten."""
        if record.marked or record.ticket is not None:
            await self.queue.leave(record)
        if record.permits_key is not None:
            # (at once: while it is held, the client's number of permits is in use)
            key, record.permits_key = record.permits_key, None
            await self.listener.let_go(key, request_window(record.ttl))
        self.forget(record)

    def forget(self, record: Hold) -> None:
        """Forget ``record``; past ``KEYS_KEPT`` keys, the states of keys nothing is on any more go too."""
        if self.holds.get(record.hold) is record:
            del self.holds[record.hold]
        keys = self.keys
        if len(keys) > KEYS_KEPT:
            for key in [key for key, state in keys.items() if state.idle]:
                del keys[key]

    # -- leases -----------------------------------------------------------------------

    def set_count(self, hold: str, count: int) -> bool:
        """Record ``count`` holds for ``hold``; False if it holds nothing any more."""
        record = self.holds.get(hold)
        if record is None or not record.granted or record.lost or record.session is None or record.session.gone:
            return False
        record.count = count
        return True

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """One ping per session (not per hold) proves every hold on it."""
        sessions: dict[Session, asyncio.Future[bool | BaseException]] = {}
        for item in items:
            record = self.holds.get(item.hold)
            session = record.session if record is not None and record.granted and not record.lost else None
            if session is not None and session not in sessions and not session.gone:
                sessions[session] = asyncio.ensure_future(self.sessions.ping(session))
        if sessions:
            await asyncio.wait(list(sessions.values()))
        results: list[bool | BaseException] = []
        for item in items:
            record = self.holds.get(item.hold)
            if record is None or not record.granted or record.lost or record.session not in sessions:
                results.append(False)
                continue
            outcome = sessions[record.session].result()
            results.append(outcome if isinstance(outcome, BaseException) else (outcome and not record.lost))
        return results
