"""Leader elections on MySQL: the plain lock's line and grants, a row per election, a term key.

An election ``N`` is a lock of its own key (:func:`~._keys.election_key`,
never the plain lock's of that name): its candidates take it like the fair
lock does, waiting FIFO in their client's line and the server's queue, with
tokens from the key's row. What an election adds (see ``_grants``):

* The leader is written down where everybody can read it: the election
  key's row, with the identity (``owner``) and the term's start by the
  server's clock (``since``), written in the statement that takes the key.
* Its leader also holds the election's *term key* (:func:`~._keys.term_key`)
  for its term, taken right after the election's key. A row is the leader
  only while one session holds both (``IS_USED_LOCK`` of each is the row's
  session): when the leader's session ends without a resign (killed,
  crashed, cut off), both keys go with it and the row it leaves is nobody.
  A term key taken with the statement after the grant also keeps a reader
  from seeing an earlier term's row of the same session as the new term's.

An observer (:class:`MySQLLeaderWatch`) reads the row. With a leader, it
waits in the server for the term key (``GET_LOCK``, on a session of its
own): the server grants it when the term ends, at once whether the leader
resigned, lost its session or was killed; the observer lets go of it and
reads again. MySQL has no notification of a new term, so with nobody
leading it reads again every ``VACANCY_POLL`` seconds: a new leader after a
vacancy is seen within that; a change while somebody leads, at once. A read
that finds the election's key held but no leader has caught a hand-over half
done (the next candidate is taking its term key): it reads again within
milliseconds instead of reporting a vacancy that is not one.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..._errors import LockError
from ..._timing import Backoff
from ..._values import Leader
from ...abc import LockRef
from .._background import Background
from .._reread import RereadWatch
from ._hold import Session
from ._keys import election_key, term_key
from ._lines import CHUNK
from ._requests import Requests
from ._sql import RELEASE, WAIT

__all__ = ["HAND_OVER_PATIENCE", "VACANCY_POLL", "Elections", "MySQLLeaderWatch"]

#: With nobody leading, how often an observer reads the election's row again, in seconds.
VACANCY_POLL = 0.5
#: How long an observer reads a hand-over half done again before it reports nobody leading, in seconds.
HAND_OVER_PATIENCE = 1.0
#: The ttl an observer's session is given (it holds nothing but the term key, for an instant).
_OBSERVER_TTL = 5.0


class Elections:
    """The elections of one backend: their leaders' rows, and the observers' waits."""

    def __init__(self, requests: Requests, background: Background, prefix: str) -> None:
        self._requests = requests
        self._background = background
        self._prefix = prefix

    def keys(self, name: str) -> tuple[str, str]:
        """The election's key and its term key."""
        return election_key(self._prefix, name), term_key(self._prefix, name)

    async def leader(self, ref: LockRef) -> Leader | None:
        """The leader of the election ``ref.name``: its row, if its term is live; one read."""
        leader, _taking = await self.read(ref)
        return leader

    async def read(self, ref: LockRef) -> tuple[Leader | None, bool]:
        """The leader of the election ``ref.name``, and (with none) whether a candidate has been
        granted the election's key and is taking its term key: a hand-over half done."""
        key, term = self.keys(ref.name)
        requests = self._requests
        sessions = requests.sessions
        session = sessions.idle_session() or await sessions.get(1.0)  # (a session for holds of any ttl)
        try:
            rows, _n, _id = await requests.spawn(
                requests.execute(session, requests.sql.leader, (term, key), _OBSERVER_TTL)
            )
        finally:
            if not session.holds and not session.waiting:
                sessions.used(session)
        if not rows:
            return None, False
        identity, token, since, live = rows[0]
        if not live:
            return None, True
        return Leader(str(identity), int(token), None if since is None else float(since)), False

    def observe(self, ref: LockRef) -> MySQLLeaderWatch:
        return MySQLLeaderWatch(self, ref)

    async def wait_term(self, term: str, woken: RereadWatch) -> None:
        """Wait in the server until nobody holds ``term`` (the leader's term ended), then wake ``woken``.

        Runs in the background for one watch; its session takes the term key
        for an instant and lets go of it at once (a new leader that asks for
        it meanwhile waits that long)."""
        requests = self._requests
        sessions = requests.sessions
        session: Session | None = None
        try:
            session = await sessions.for_waiting(1.0)
            while True:
                rows, _n, _id = await requests.execute(session, WAIT, (term, CHUNK), _OBSERVER_TTL, wait=CHUNK)
                if rows[0][0] == 1:
                    await requests.execute(session, RELEASE, (term,), _OBSERVER_TTL)
                    break
        except LockError:
            pass  # (the watch reads again, and fails there if the server stays away)
        finally:
            if session is not None and not session.gone:
                sessions.done_waiting(session)
            woken.wake()

    def spawn_wait(self, term: str, woken: RereadWatch) -> asyncio.Task[None]:
        """Start :meth:`wait_term` in the backend's background."""
        return self._background.spawn(self.wait_term(term, woken))


class MySQLLeaderWatch(RereadWatch):
    """The leader of one election after each change (``Elects.observe``): a read after the term key
    is let go of (the leader's term ended), and with nobody leading every ``VACANCY_POLL``."""

    def __init__(self, elections: Elections, ref: LockRef) -> None:
        super().__init__()
        self._elections = elections
        self._ref = ref
        self._term = elections.keys(ref.name)[1]
        self._waiting: asyncio.Task[None] | None = None

    async def _join(self) -> None:
        return None

    def _leave(self) -> None:
        task, self._waiting = self._waiting, None
        if task is not None and not task.done():
            task.cancel()  # (a cancelled wait closes its session: the server ends the wait)

    async def _read(self) -> tuple[Leader | None, float | None]:
        # A hand-over half done (the next candidate has the election's key, not yet its term key)
        # is read again shortly rather than reported as nobody leading; a candidate stuck there
        # (its process paused) is reported as what it is, nobody leading, after HAND_OVER_PATIENCE.
        loop = asyncio.get_running_loop()
        until = loop.time() + HAND_OVER_PATIENCE
        backoff = Backoff(first=0.005, cap=0.1)
        leader, taking = await self._elections.read(self._ref)
        while taking and loop.time() < until:
            await asyncio.sleep(backoff.next())
            leader, taking = await self._elections.read(self._ref)
        if leader is None:
            return None, VACANCY_POLL
        if self._waiting is None or self._waiting.done():
            self._waiting = self._elections.spawn_wait(self._term, self)
        return leader, None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            super().close()
        self._leave()
