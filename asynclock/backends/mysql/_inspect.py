"""Who holds a lock and who waits: ``IS_USED_LOCK``, the key's row, and the server's process list.

Holds share sessions, so the server knows which session holds a key
(``IS_USED_LOCK``) but not for which hold. The key's row names the holder
and its token as of the last grant; it is the holder's while the row's
session is the one holding the key (else the key is held by a client that
is not asynclock, shown as ``connection <id>``, without a token). The hold
count is known for this client's own holds only (the front keeps it); the
remaining ttl is not known (the server does not say how long a session has
been idle against its wait_timeout). ``waiters`` counts the sessions whose
statement waits for the key in the process list (a client's line waits on
one session), and this client's own line in full; the process list shows
the sessions of the server's other users only with the ``PROCESS``
privilege.

``names`` lists the plain locks with a row whose session holds them now
(the locks asynclock clients took), and, where the server has a table of its
named locks (MariaDB with its ``metadata_lock_info`` plugin, MySQL's
``performance_schema.metadata_locks``), the keys under the prefix that other
clients hold by the name as it is.
"""

from __future__ import annotations

from typing import Any

from ..._errors import LockError
from ..._values import LockInfo
from ...abc import LockRef
from ._errors import code
from ._hold import KeyState
from ._keys import lock_key, marker
from ._requests import Requests
from ._sql import LOCK_TABLES, WAITERS

__all__ = ["Inspector"]

#: The ttl that bounds info's requests (they take no lock).
_INFO_TTL = 5.0


class Inspector:
    """``info`` and ``names`` of one backend."""

    def __init__(self, requests: Requests, keys: dict[str, KeyState], prefix: str) -> None:
        self._requests = requests
        self._keys = keys
        self._prefix = prefix
        #: which of ``LOCK_TABLES`` the server has (None: not known yet; -1: neither)
        self._lock_table: int | None = None

    async def _run(self, statement: str, args: Any) -> Any:
        """``statement``'s rows, on a session of the client's (in a task of its own)."""
        requests = self._requests
        sessions = requests.sessions
        session = sessions.idle_session() or await sessions.get(1.0)  # (a session for holds of any ttl)
        try:
            rows, _n, _id = await requests.spawn(requests.execute(session, statement, args, _INFO_TTL))
        finally:
            if not session.holds and not session.waiting:
                sessions.used(session)
        return rows

    def _waiting(self, state: KeyState | None, others: int) -> int:
        """Waiters of a key: ``others`` sessions waiting in the server, of which this client's
        count with its whole line instead."""
        line = None if state is None else state.line
        if line is None:
            return others
        return max(0, others - len(line.waits)) + line.count

    async def info(self, ref: LockRef, key: str, name_key: str, slots: tuple[str, ...]) -> LockInfo:
        """What the server says of ``ref``, whose main key is ``key`` (a semaphore's base: its holders
        hold its ``slots``); ``name_key`` is what ``info().key`` shows."""
        state = self._keys.get(key)
        sql = self._requests.sql
        if slots:
            rows = await self._run(sql.slots("info", len(slots)), slots)
            count = await self._run(WAITERS, (marker(key),))
            waiting = self._waiting(state, int(count[0][0]))
            if not rows:
                return LockInfo(ref.name, name_key, None, 0, None, waiting, None)
            holders = tuple(str(owner) for owner, _token in rows)
            return LockInfo(ref.name, name_key, holders[0], 1, None, waiting, int(rows[0][1]), holders)
        rows = await self._run(sql.info_lock, (key, marker(key), key))
        used, conn, token, owner, count = rows[0]
        waiting = self._waiting(state, int(count))
        if used is None:
            return LockInfo(ref.name, name_key, None, 0, None, waiting, None)
        if conn != used or owner is None:
            who = f"connection {used}"  # a client that is not asynclock (or one between its grant and its row)
            return LockInfo(ref.name, name_key, who, 1, None, waiting, None, (who,))
        holder, hold_count = str(owner), 1
        for record in () if state is None else state.holders.values():
            if record.token == token:
                hold_count = record.count  # (this client's own hold: the front keeps its count)
        return LockInfo(ref.name, name_key, holder, hold_count, None, waiting, int(token), (holder,))

    async def names(self) -> list[str]:
        """Names of the plain locks under this client's prefix held now."""
        rows = await self._run(self._requests.sql.names, ())
        prefix = self._prefix
        found = {str(name) for key, name in rows if lock_key(prefix, str(name)) == key}
        for key in await self._held_keys():
            name = key[len(prefix) + 1 :]
            if lock_key(prefix, name) == key:  # (a hashed key says nothing of its name)
                found.add(name)
        return sorted(found)

    async def _held_keys(self) -> list[str]:
        """Keys under the prefix held now, by the server's own table of named locks (none without one)."""
        pattern = self._prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"
        choices = range(len(LOCK_TABLES)) if self._lock_table is None else (self._lock_table,)
        for choice in choices:
            if choice < 0:
                break
            try:
                rows = await self._run(LOCK_TABLES[choice], (pattern,))
            except LockError as exc:
                number = None if exc.__cause__ is None else code(exc.__cause__)
                if self._lock_table is not None or number is None or number >= 2000:
                    raise  # (the server or the connection failed, not the table)
                continue  # (no such table here, or it may not be read)
            self._lock_table = choice
            return [str(key) for (key,) in rows]
        self._lock_table = -1
        return []
