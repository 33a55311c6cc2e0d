"""Leader elections on PostgreSQL: the plain lock's queue and grants, a leaders table, a channel per election.

An election ``N`` is a lock of its own advisory key (:func:`~._keys.election_key`,
never the plain lock's of that name): its candidates take it like the fair
lock does, on the client's shared sessions, waiting FIFO in the queue table
(``_queue``), with tokens from the token sequence (``_tokens``: they keep
increasing across a crash). What an election adds:

* The leader is written down where everybody can read it: a row of the
  UNLOGGED table ``<table>_leaders`` (created on the first election's
  request, not at start: a client that never elects needs no CREATE for it)
  keyed by the election's key, with the identity, the token, the term's
  start by the server's clock and the ttl. The new leader writes it on the
  session that holds the election's key, in the statement after its grant
  and before its term begins (the lock statements are those of every lock;
  in between a reader sees nobody lead, which is true of the term's body as
  well). A resign deletes the row (of its own token only) before letting go
  of the key.
* A row is the leader only while it is live: in the statement that writes
  it, the leader also takes a *term key* (:func:`~._keys.term_key` of the
  election's key and the token), and a reader counts the row only if one
  session holds both the term key and the election's key exclusively
  (``pg_locks``). When the leader's session ends without a resign (killed,
  crashed, cut off) both keys go with it, and the row it leaves is seen as
  nobody. The term key, rather than the backend pid the row could record,
  since a session holds many holds of its client one after another (a row
  of an earlier term on the same session must not pass for the next one)
  and the server reuses pids. The term key is let go of no later than the
  election's key, so a row never outlives its lock as live; a statement cut
  short leaves both to the key's settling (``_hold``, ``_requests``).
* Every change is NOTIFYed on the election's channel
  (:func:`~._keys.election_channel`): the new leader's row write, the
  resign's delete, and a leader's client that sees its session end (from its
  listening session, best effort). With candidates in line, a leader whose
  session ended silently is followed within a request window: the first
  candidate looks again at that pace (``_queue``), and its grant notifies.
* A resign with a live candidate in line is a hand-over: the release after
  it wakes that candidate, whose grant and row follow within a few round
  trips. Its delete notifies ``next <s>`` instead of ``gone``, and observers
  do not read then (they would see nobody lead for those round trips) but
  wait for the new row's notification, or ``s`` seconds (a request window
  of the leader's ttl) if it does not come. So a graceful hand-over is seen
  as one change, from the old leader to the new.

An observer (:class:`PostgresLeaderWatch`) LISTENs on the channel on its
client's listening session and reads the row in the same turn of that
session, so the LISTEN is in effect before the read; it reads again after
each notification (but a hand-over's, above) and after its listening
session was opened again (notifications may have been missed meanwhile).
A session that ends sends nothing, so when the leader's process dies (no
client left to notify) with nobody in line, an observer looks again one of
the leader's ttl after its read: the read says how many candidates wait,
and with some in line it waits for a notification only (and looks again
after ``BACKSTOP`` ttl, in case they all left meanwhile). Terms that begin
and end between two reads are seen as one change; a leader's ``since`` is
when it wrote its row, by the server's clock.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

import asyncpg

from ..._errors import LockError
from ..._timing import request_window
from ..._values import Leader
from ...abc import LockRef
from .._background import Background
from .._reread import RereadWatch
from ._errors import CLIENT_ERRORS
from ._hold import Hold, Session
from ._keys import Key, election_channel, election_key, term_key
from ._listener import Listener
from ._pool import ms
from ._requests import Requests
from ._sql import CREATE_LEADERS, EXISTS, LOST
from ._tokens import create

__all__ = ["BACKSTOP", "Elections", "PostgresLeaderWatch"]

logger = logging.getLogger("asynclock")

_fetchval = asyncpg.Connection.fetchval

#: With candidates in line, an observer looks again after this many of the leader's ttl
#: without a notification (the candidates may all have left while the leader was gone).
BACKSTOP = 10
#: A moment past a wait, so that a session ended by its idle timeout is gone when the observer looks.
_PAST = 0.002


class Elections:
    """The elections of one backend: the leaders table, the leaders' rows and notifications, the observers."""

    def __init__(self, requests: Requests, listener: Listener, background: Background, prefix: str) -> None:
        self._requests = requests
        self._sql = requests.sql
        self._leaders = requests.schema.leaders
        self._listener = listener
        self._background = background
        self._prefix = prefix
        self._ready = False
        self._watches: dict[str, weakref.WeakSet[PostgresLeaderWatch]] = {}

    def key(self, name: str) -> Key:
        return election_key(self._prefix, name)

    async def ready(self) -> None:
        """Create the leaders table if it is missing (once per backend): a refusal is ConfigurationError."""
        if self._ready:
            return
        leaders = self._leaders

        async def make(conn: Any) -> None:
            if not await conn.fetchval(EXISTS, leaders):
                await create(conn, CREATE_LEADERS.format(leaders=leaders))

        await self._listener.statement(make)
        self._ready = True

    # -- a leader's row -------------------------------------------------------------

    async def announce(self, record: Hold, session: Session, token: int) -> None:
        """``record`` was granted its election's key on ``session`` with ``token``: write its row, notify."""
        state, ttl = record.state, record.ttl
        term = term_key(state.key, token)
        record.term = term
        state.terms.add(term)  # (until a resign lets go of it: a statement cut short leaves it to the settling)
        await self._requests.run(
            session, ttl, _fetchval, self._sql.announce,
            *state.key, record.ref.name, record.ref.identity or "", token, ttl, *term,
            election_channel(state.key), ms(ttl / 6),
        )  # fmt: skip

    async def retire(self, record: Hold, session: Session) -> None:
        """``record`` resigns: its row goes, its term key is let go of, observers are told (the key is next)."""
        term, token = record.term, record.token
        if term is None or token is None:
            return
        state = record.state
        channel = election_channel(state.key)
        # (observers told of a hand-over look anyway if the next leader's row has not come in a request window)
        within = f"{request_window(record.ttl):.3f}"
        await self._requests.run(
            session, record.ttl, _fetchval, self._sql.retire, *state.key, token, *term, channel, within
        )
        record.term = None
        state.terms.discard(term)

    def lost(self, records: list[Hold]) -> None:
        """The sessions of these leaders ended: tell observers (best effort, in the background)."""
        channels = {election_channel(record.state.key) for record in records if record.term is not None}
        for record in records:
            if record.term is not None:
                record.state.terms.discard(record.term)
                record.term = None
        for name in channels:
            self._background.spawn(self._tell_lost(name))

    async def _tell_lost(self, name: str) -> None:
        with contextlib.suppress(LockError, *CLIENT_ERRORS):
            await self._listener.statement(lambda conn: conn.fetchval(LOST, name))

    # -- reading ----------------------------------------------------------------------

    async def read(self, ref: LockRef, listen: bool = False) -> tuple[Leader | None, float | None]:
        """The leader of ``ref``'s election (one read on the listening session), and when to look
        again without a notification (seconds; None: wait for one). ``listen``: LISTEN on its
        channel first, in the same turn of the session."""
        await self.ready()
        key = self.key(ref.name)
        channel = election_channel(key)
        listener = self._listener
        statement = self._sql.leader

        async def run(conn: Any) -> Any:
            if listen:
                await listener.listen(conn, channel, self._notified)
            return await conn.fetchrow(statement, *key, *listener.key)

        row = await listener.statement(run)
        if row is None or not row["live"]:
            return None, None
        ttl = float(row["ttl"])
        again = ttl * BACKSTOP if row["waiting"] else ttl
        return Leader(row["identity"], int(row["token"]), float(row["since"])), again + _PAST

    async def leader(self, ref: LockRef) -> Leader | None:
        return (await self.read(ref))[0]

    # -- observers ----------------------------------------------------------------------

    def observe(self, ref: LockRef) -> PostgresLeaderWatch:
        return PostgresLeaderWatch(self, ref)

    def join(self, watch: PostgresLeaderWatch) -> None:
        watches = self._watches.get(watch.channel)
        if watches is None:
            watches = self._watches[watch.channel] = weakref.WeakSet()
        watches.add(watch)

    def leave(self, watch: PostgresLeaderWatch) -> None:
        """``watch`` stops observing (no I/O: the session stays LISTENing, and drops the channel's messages)."""
        watches = self._watches.get(watch.channel)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.channel]

    def _notified(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        within = _handing_over(payload)
        for watch in list(self._watches.get(channel, ())):
            if within is None:
                watch.wake()
            else:
                watch.look_within(within)

    def wake_all(self) -> None:
        """The listening session ended (notifications may be missed): every observer reads again."""
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.wake()


def _handing_over(payload: str) -> float | None:
    """A resign's notification that a candidate in line is next ('next <s>'): within how many
    seconds to look if its row has not come; None for any other notification (look now)."""
    kind, _, within = payload.partition(" ")
    if kind != "next":
        return None
    try:
        return float(within)
    except ValueError:
        return None


class PostgresLeaderWatch(RereadWatch):
    """The leader of one election after each change (``Elects.observe``): a read after each
    notification on the election's channel, each new listening session, and (nobody in line)
    one of the leader's ttl after a read."""

    def __init__(self, elections: Elections, ref: LockRef) -> None:
        super().__init__()
        self._elections = elections
        self._ref = ref
        self.channel = election_channel(elections.key(ref.name))

    async def _join(self) -> None:
        self._elections.join(self)

    def _leave(self) -> None:
        self._elections.leave(self)

    async def _read(self) -> tuple[Leader | None, float | None]:
        # (a session that ends sends nothing: the read says when to look anyway)
        return await self._elections.read(self._ref, listen=True)
