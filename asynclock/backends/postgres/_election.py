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

An observer (:class:`PostgresLeaderWatch`) LISTENs on the channel on its
client's listening session and reads the row in the same turn of that
session, so the LISTEN is in effect before the read; it reads again after
each notification and after its listening session was opened again
(notifications may have been missed meanwhile). A session that ends sends
nothing, so when the leader's process dies (no client left to notify) with
nobody in line, an observer looks again one of the leader's ttl after its
read: the read says how many candidates wait, and with some in line it
waits for a notification only (and looks again after ``BACKSTOP`` ttl, in
case they all left meanwhile). Terms that begin and end between two reads
are seen as one change; a leader's ``since`` is when it wrote its row,
by the server's clock.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import TYPE_CHECKING, Any

import asyncpg

from ..._errors import LockError
from ..._values import Leader
from ...abc import LockRef
from .._reread import RereadWatch
from . import _sql
from ._errors import CLIENT_ERRORS, MapErrors
from ._keys import Key, election_channel, election_key, term_key
from ._listener import Listener
from ._sessions import Session, Sessions, ms
from ._tokens import create

if TYPE_CHECKING:
    from ._hold import Hold
    from ._requests import Requests

__all__ = ["BACKSTOP", "Elections", "PostgresLeaderWatch"]

logger = logging.getLogger("asynclock")

_fetchval = asyncpg.Connection.fetchval

#: With candidates in line, an observer looks again after this many of the leader's ttl
#: without a notification (the candidates may all have left while the leader was gone).
BACKSTOP = 10
#: A moment past a wait, so that a session ended by its idle timeout is gone when the observer looks.
_PAST = 0.002

#: The leaders table. The key (k1, k2) is the election's advisory key; (t1, t2) the term key.
CREATE_LEADERS = (
    "CREATE UNLOGGED TABLE {leaders} (k1 int4 NOT NULL, k2 int4 NOT NULL, name text NOT NULL,"
    " identity text NOT NULL, token int8 NOT NULL, since timestamptz NOT NULL, ttl float8 NOT NULL,"
    " t1 int4 NOT NULL, t2 int4 NOT NULL, PRIMARY KEY (k1, k2))"
)

#: The new leader's row and its term key, on the session that holds the election's key, and the
#: election's notification. $1, $2 election key; $3 name; $4 identity; $5 token; $6 ttl; $7, $8 term
#: key; $9 channel; $10 lock_timeout (ms, text: only a row lock of a statement in flight can make
#: it wait). Returns (written, term key taken).
ANNOUNCE = """
    WITH term AS MATERIALIZED (
        SELECT set_config('lock_timeout', $10, true) AS lt, pg_try_advisory_lock($7::int4, $8::int4) AS ok
    ), up AS (
        INSERT INTO {leaders} AS r (k1, k2, name, identity, token, since, ttl, t1, t2)
        SELECT $1, $2, $3, $4, $5, clock_timestamp(), $6, $7, $8 FROM term
        ON CONFLICT (k1, k2) DO UPDATE SET name = EXCLUDED.name, identity = EXCLUDED.identity,
            token = EXCLUDED.token, since = EXCLUDED.since, ttl = EXCLUDED.ttl, t1 = EXCLUDED.t1, t2 = EXCLUDED.t2
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM up)::int AS written, (SELECT ok FROM term) AS term, pg_notify($9, 'leader')
"""

#: A resign: the leader's row (of its token only: a later leader's stays), its term key, the
#: notification; the election's key is let go of by the lock's release after it.
#: $1, $2 election key; $3 token; $4, $5 term key; $6 channel. Returns (deleted).
RETIRE = """
    WITH gone AS (DELETE FROM {leaders} WHERE k1 = $1 AND k2 = $2 AND token = $3 RETURNING 1)
    SELECT (SELECT count(*) FROM gone)::int, pg_advisory_unlock($4::int4, $5::int4), pg_notify($6, 'gone')
"""

#: The row of an election, whether it is live (one session holds its term key and the
#: election's key), and the live candidates in line. $1, $2 election key; $3, $4 the running
#: session's session key. Returns (identity, token, since, ttl, live, waiting) or no row.
LEADER = f"""
    SELECT r.identity, r.token, extract(epoch FROM r.since)::float8 AS since, r.ttl,
           EXISTS (
               SELECT 1 FROM pg_locks t JOIN pg_locks e ON e.pid = t.pid
               WHERE t.locktype = 'advisory' AND t.objsubid = 2 AND t.granted AND t.mode = 'ExclusiveLock'
                 AND t.classid::int8 = (r.t1::int8 & 4294967295) AND t.objid::int8 = (r.t2::int8 & 4294967295)
                 AND e.locktype = 'advisory' AND e.objsubid = 2 AND e.granted AND e.mode = 'ExclusiveLock'
                 AND e.classid::int8 = (r.k1::int8 & 4294967295) AND e.objid::int8 = (r.k2::int8 & 4294967295)
                 AND t.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND e.database = t.database
           ) AS live,
           (SELECT count(*) FROM {{queue}} q
            WHERE q.k1 = $1 AND q.k2 = $2 AND {_sql.LIVE.format(ls1="$3", ls2="$4")})::int AS waiting
    FROM {{leaders}} r WHERE r.k1 = $1 AND r.k2 = $2
"""

#: A leader's client saw the session of its term end: observers look. $1 channel.
LOST = "SELECT pg_notify($1, 'lost')"


class Elections:
    """The elections of one backend: the leaders table, the leaders' rows and notifications, the observers."""

    def __init__(
        self, requests: Requests, listener: Listener, sessions: Sessions, errors: MapErrors, prefix: str
    ) -> None:
        self._requests = requests
        self._listener = listener
        self._sessions = sessions
        self._errors = errors
        self._prefix = prefix
        #: the quoted name of the leaders table, and the queue's (set at the backend's set-up)
        self.leaders = ""
        self.queue = ""
        self._ready = False
        self._statements: tuple[str, str, str] = ("", "", "")
        self._watches: dict[str, weakref.WeakSet[PostgresLeaderWatch]] = {}

    def key(self, name: str) -> Key:
        return election_key(self._prefix, name)

    async def ready(self) -> None:
        """Create the leaders table if it is missing (once per backend): a refusal is ConfigurationError."""
        if self._ready:
            return
        leaders = self.leaders

        async def make(conn: Any) -> None:
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", leaders):
                await create(conn, CREATE_LEADERS.format(leaders=leaders))

        await self._listener.statement(make)
        self._statements = (
            ANNOUNCE.format(leaders=leaders),
            RETIRE.format(leaders=leaders),
            LEADER.format(leaders=leaders, queue=self.queue),
        )
        self._ready = True

    # -- a leader's row -------------------------------------------------------------

    async def announce(self, record: Hold, session: Session, token: int) -> None:
        """``record`` was granted its election's key on ``session`` with ``token``: write its row, notify."""
        state, ttl = record.state, record.ttl
        term = term_key(state.key, token)
        record.term = term
        state.terms.add(term)  # (until a resign lets go of it: a statement cut short leaves it to the settling)
        await self._requests.run(
            session, ttl, _fetchval, self._statements[0],
            *state.key, record.ref.name, record.ref.identity or "", token, ttl, *term,
            election_channel(state.key), ms(ttl / 6),
        )  # fmt: skip

    async def retire(self, record: Hold, session: Session) -> None:
        """``record`` resigns: its row goes, its term key is let go of, observers are told (the key is next)."""
        term, token = record.term, record.token
        if term is None or token is None:
            return
        state = record.state
        await self._requests.run(
            session, record.ttl, _fetchval, self._statements[1], *state.key, token, *term, election_channel(state.key)
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
            self._sessions.spawn(self._tell_lost(name))

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
        statement = self._statements[2]

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

    def _notified(self, _conn: Any, _pid: int, channel: str, _payload: str) -> None:
        for watch in list(self._watches.get(channel, ())):
            watch.wake()

    def wake_all(self) -> None:
        """The listening session ended (notifications may be missed): every observer reads again."""
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.wake()


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
