"""Who holds a lock and who waits: ``pg_locks`` for the sessions, their clients for the holds.

Holds share sessions, so the server knows which session holds a key but not
for which hold, nor its token. ``info`` reads the holding sessions from
``pg_locks`` (with their application_name, which names the client and its
backend), answers for this client's own sessions from what it knows, and
asks every other asynclock client that holds the key on its channel
(``i <this backend> <request> <k1> <k2>``); each answers with its holds of
that key (``r <request> <json>``: hold id, token, hold count, name check,
session pid). A client that does not answer in ``ASK_TIMEOUT`` is shown by
its id and session (``<client id> (pid N)``), without a token. Names whose
keys collide are told apart by the name check each answer carries.
``waiters`` counts the live rows of the key's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from ..._values import LockInfo
from ...abc import LockRef
from .._background import Background
from ._hold import KeyState
from ._keys import Key, channel, name_check, parse_app_name
from ._listener import Listener
from ._sessions import Sessions
from ._sql import LOCKS_ON, NOTIFY_EACH, Statements

__all__ = ["ASK_TIMEOUT", "Holder", "Inspector", "describe"]

logger = logging.getLogger("asynclock")

#: How long ``info`` waits for the other clients' answers, in seconds.
ASK_TIMEOUT = 0.5
#: NOTIFY payloads are limited to 8000 bytes: an answer lists at most this many holds.
ANSWER_MAX = 60


def _unsigned(key: Key) -> tuple[int, int]:
    return key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Holder:
    """One hold of a key as the server and the holders' clients tell it."""

    #: the hold id (a client that did not answer: ``<client id> (pid N)``; a session not of
    #: asynclock: ``pid N (<application_name>)``)
    hold: str
    token: int | None
    count: int
    #: the session that holds the key
    pid: int
    #: whose session it is: this client's, another asynclock client's (its backend id), or neither
    mine: bool
    backend: str | None


class Inspector:
    """``info`` and ``names`` of one backend, and its answers to other clients' questions."""

    def __init__(
        self,
        listener: Listener,
        sessions: Sessions,
        keys: dict[Key, KeyState],
        prefix: str,
        sql: Statements,
        background: Background,
    ) -> None:
        self._listener = listener
        self._sessions = sessions
        self._keys = keys
        self._prefix = prefix
        self._sql = sql
        self._background = background
        # request id -> (answers by backend, backends still to answer, done)
        self._asked: dict[str, tuple[dict[str, list[Any]], set[str], asyncio.Event]] = {}

    async def info(self, ref: LockRef, main: Key, held: list[Key], key_name: str) -> LockInfo:
        """What the server and the holders' clients say about ``ref`` (its ``main`` key, ``held`` keys)."""
        holders, waiters = await self.holders(ref, main, held)
        return describe(ref, key_name, holders, waiters)

    async def holders(self, ref: LockRef, main: Key, held: list[Key]) -> tuple[list[Holder], int]:
        """Who holds ``ref`` (its ``main`` key, ``held`` keys), and how many wait."""
        listener, sql = self._listener, self._sql
        m1, m2 = _unsigned(main)
        u1 = [_unsigned(k)[0] for k in held]
        u2 = [_unsigned(k)[1] for k in held]

        async def read(conn: Any) -> tuple[list[Any], int]:
            rows = await conn.fetch(LOCKS_ON, m1, m2, u1, u2)
            queued = await conn.fetchval(sql.queued, *main, *listener.key)
            return rows, int(queued)

        rows, waiters = await listener.statement(read)
        check = name_check(self._prefix, ref.name)
        mine = {session.pid: session for session in self._sessions.sessions}
        state = self._keys.get(main)
        entries: list[tuple[int, str | None, str | None, str]] = []  # (pid, backend, client, fallback)
        seen: set[int] = set()
        ask: set[str] = set()
        for row in rows:
            if not row["granted"]:
                waiters += 1  # a session waiting in the server's own queue (a client of another version)
                continue
            if ref.kind == "semaphore" and row["main"]:
                continue
            pid = int(row["pid"])
            if pid in seen:
                continue
            seen.add(pid)
            parsed = parse_app_name(row["app"])
            if pid in mine:
                entries.append((pid, None, None, ""))
            elif parsed is not None and parsed[1] != listener.backend:
                ask.add(parsed[1])
                entries.append((pid, parsed[1], parsed[0], f"{parsed[0]} (pid {pid})"))
            else:
                entries.append((pid, None, None, f"pid {pid} ({row['app'] or 'not asynclock'})"))
        answers = await self._ask(ask, main) if ask else {}
        holders: list[Holder] = []
        for pid, backend, _client, fallback in entries:
            if pid in mine:
                if state is not None:
                    for record in state.holders.values():
                        session = record.session
                        if (
                            session is not None
                            and session.pid == pid
                            and record.ref.name == ref.name
                            and not record.lost
                        ):
                            holders.append(Holder(record.hold, record.token, record.count, pid, True, None))
                continue
            if backend is not None and backend in answers:
                for hold, token, count, their_check, their_pid in answers[backend]:
                    if their_pid == pid and their_check == check:
                        holders.append(Holder(hold, token, count, pid, False, backend))
                continue
            holders.append(Holder(fallback, None, 1, pid, False, backend))
        return holders, waiters

    async def _ask(self, backends: set[str], key: Key) -> dict[str, list[Any]]:
        """Ask ``backends`` for their holds of ``key``; their answers within ``ASK_TIMEOUT``."""
        listener = self._listener
        request = secrets.token_hex(4)
        answers: dict[str, list[Any]] = {}
        done = asyncio.Event()
        self._asked[request] = (answers, set(backends), done)
        try:
            payload = f"i {listener.backend} {request} {key[0]} {key[1]}"
            channels = [channel(backend) for backend in backends]
            await listener.statement(lambda conn: conn.fetchval(NOTIFY_EACH, channels, payload))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ASK_TIMEOUT):
                    await done.wait()
        finally:
            del self._asked[request]
        return answers

    def asked(self, text: str) -> None:
        """Another client asks for this client's holds of a key (``<backend> <request> <k1> <k2>``)."""
        try:
            asker, request, k1, k2 = text.split(" ")
            key = (int(k1), int(k2))
        except ValueError:
            return
        state = self._keys.get(key)
        holds: list[Any] = []
        if state is not None:
            for record in state.holders.values():
                session = record.session
                if record.granted and not record.lost and session is not None:
                    holds.append(
                        [
                            record.hold,
                            record.token,
                            record.count,
                            name_check(self._prefix, record.ref.name),
                            session.pid,
                        ]
                    )
        payload = f"r {request} {self._listener.backend} {json.dumps(holds[:ANSWER_MAX], separators=(',', ':'))}"
        target = channel(asker)

        async def answer() -> None:
            with contextlib.suppress(Exception):
                await self._listener.statement(lambda conn: conn.fetchval(NOTIFY_EACH, [target], payload))

        self._background.spawn(answer())

    def answered(self, text: str) -> None:
        """An answer to one of this client's questions (``<request> <backend> <json>``)."""
        try:
            request, backend, body = text.split(" ", 2)
            holds = json.loads(body)
        except ValueError:
            return
        asked = self._asked.get(request)
        if asked is None:
            return
        answers, waiting, done = asked
        answers[backend] = [tuple(hold) for hold in holds]
        waiting.discard(backend)
        if not waiting:
            done.set()

    async def names(self) -> list[str]:
        """Names of the plain locks held now, under this backend's fence table."""
        sql = self._sql
        rows = await self._listener.statement(lambda conn: conn.fetch(sql.held_names))
        return [bytes(row["name"]).decode() for row in rows]


def describe(ref: LockRef, key_name: str, holders: list[Holder], waiters: int) -> LockInfo:
    """The LockInfo of ``ref`` with these holders (the first is the owner) and waiters."""
    owner = holders[0] if holders else None
    return LockInfo(
        name=ref.name,
        key=key_name,
        owner=owner.hold if owner else None,
        hold_count=owner.count if owner else 0,
        ttl=None,
        waiters=waiters,
        token=owner.token if owner else None,
        holders=tuple(holder.hold for holder in holders),
    )
