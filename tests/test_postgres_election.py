"""PostgreSQL-only behaviour of leader elections (the generic ones run in ``test_election.py``).

A leader whose session is ended (``pg_terminate_backend``) is replaced by the
next candidate within a request window, its body ends with LockLost, and
observers see the change without waiting for a ttl, also with nobody in line;
a hand-over announced to observers that does not come is seen as nobody
after the window it named; the row a dead leader leaves is not reported as
the leader, not even while somebody holds the election's key without a
row; a role that may not create the leaders table (or write it) gets
ConfigurationError at once; terms' tokens keep increasing across a server
crash.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

import asynclock
from asynclock import ConfigurationError, LockLost
from asynclock.backends.postgres import FLOOR, election_key
from asynclock.backends.postgres._keys import election_channel
from tests.harnesses import insides
from tests.harnesses.postgres import PostgresHarness, password_role, tokens_from
from tests.servers import scaled
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

#: Far longer than any test here: what happens did not wait for a ttl.
LONG_TTL = 30.0
#: A bound well below LONG_TTL.
PROMPT = scaled(5)
#: Longer than anything here may take: a configuration error must come well before it.
PATIENCE = scaled(10)


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[PostgresHarness]:
    harness = PostgresHarness(postgres_server)
    async with harness:
        yield harness


class Leading:
    """A task that leads ``election`` until it is cancelled or loses (``ended`` says how it ended)."""

    def __init__(self, election: asynclock.Election) -> None:
        self.term: asynclock.Term | None = None
        self.led = asyncio.Event()
        self.task = asyncio.create_task(self._run(election))

    async def _run(self, election: asynclock.Election) -> None:
        async with election.leadership() as term:
            self.term = term
            self.led.set()
            await asyncio.sleep(3600)

    async def leads(self, within: float = PROMPT) -> asynclock.Term:
        async with asyncio.timeout(within):
            await self.led.wait()
        assert self.term is not None
        return self.term


async def leaders_row(pg: PostgresHarness, name: str) -> tuple[str, int] | None:
    """The leaders table's row of the election ``name`` (identity, token), live or not."""
    k1, k2 = election_key(pg.prefix, name)
    row = await (await pg.admin()).fetchrow(
        f'SELECT identity, token FROM "{pg.prefix}_fence_leaders" WHERE k1 = $1 AND k2 = $2', k1, k2
    )
    return None if row is None else (row["identity"], row["token"])


async def test_a_terminated_leader_session_passes_leadership_on_and_observers_see_it(pg: PostgresHarness) -> None:
    """The leader's session is ended by an administrator: the candidate in line leads within a
    request window (not a ttl), the old leader's body ends with LockLost, observers see it."""
    a, b, watcher = (pg.connect(ttl=LONG_TTL) for _ in range(3))
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    first = Leading(a.election("e", identity="a"))
    term_a = await first.leads()
    assert await asyncio.wait_for(anext(changes), PROMPT) == await watcher.election("e").leader()
    second = Leading(b.election("e", identity="b"))
    async with asyncio.timeout(PROMPT):
        while await pg.queued_on(election_key(pg.prefix, "e")) != 1:
            await asyncio.sleep(0.01)
    assert await pg.expire_shape("election", "e")
    term_b = await second.leads()
    with pytest.raises(LockLost):
        await asyncio.wait_for(first.task, PROMPT)
    assert term_a.token is not None and term_b.token is not None and term_b.token > term_a.token
    seen: list[str | None] = []
    async with asyncio.timeout(PROMPT):
        while not seen or seen[-1] != "b":
            leader = await anext(changes)
            seen.append(None if leader is None else leader.identity)
    assert set(seen) <= {None, "b"}, seen  # (nobody, for a moment, then b)
    leader = await watcher.election("e").leader()
    assert leader is not None and (leader.identity, leader.token) == ("b", term_b.token)
    second.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second.task
    await changes.aclose()  # type: ignore[attr-defined]


async def test_a_leader_lost_with_nobody_in_line_is_seen_gone_before_its_ttl(pg: PostgresHarness) -> None:
    """A session's end sends no notification; the leader's client, which sees its connection
    close, notifies the election's observers, who need not wait for the ttl."""
    a, watcher = pg.connect(ttl=LONG_TTL), pg.connect(ttl=LONG_TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    leading = Leading(a.election("e", identity="a"))
    await leading.leads()
    assert (await asyncio.wait_for(anext(changes), PROMPT)).identity == "a"  # type: ignore[union-attr]
    assert await pg.expire_shape("election", "e")
    assert await asyncio.wait_for(anext(changes), PROMPT) is None
    with pytest.raises(LockLost):
        await asyncio.wait_for(leading.task, PROMPT)
    await changes.aclose()  # type: ignore[attr-defined]


async def test_a_hand_over_that_does_not_come_is_seen_as_nobody_after_the_window_it_named(
    pg: PostgresHarness,
) -> None:
    """A resign with a candidate in line tells observers that the next leader is coming
    (``next <s>``): they wait for its row's notification instead of reading at once, but not
    for ever. Here the notification comes from an administrator, with the leader's row
    deleted, and no new leader follows: the observer looks again after the window and sees
    that nobody leads (with nobody in line it would otherwise wait for the 30 s ttl)."""
    a, watcher = pg.connect(ttl=LONG_TTL), pg.connect(ttl=LONG_TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    leading = Leading(a.election("e", identity="a"))
    await leading.leads()
    assert (await asyncio.wait_for(anext(changes), PROMPT)).identity == "a"  # type: ignore[union-attr]
    key = election_key(pg.prefix, "e")
    admin = await pg.admin()
    loop = asyncio.get_running_loop()
    async with admin.transaction():
        await admin.execute(f'DELETE FROM "{pg.prefix}_fence_leaders" WHERE k1 = $1 AND k2 = $2', *key)
        await admin.execute("SELECT pg_notify($1, 'next 0.3')", election_channel(key))
        told = loop.time()
    assert await asyncio.wait_for(anext(changes), PROMPT) is None
    assert loop.time() - told >= 0.2, "the observer waited for the next leader's news first"
    leading.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leading.task
    await changes.aclose()  # type: ignore[attr-defined]


async def test_the_row_a_dead_leader_leaves_is_not_the_leader(pg: PostgresHarness) -> None:
    """The row stays when the leader's session ends without a resign; it is not reported, not
    even while another session holds the election's key without having written its row yet."""
    a, reader = pg.connect(ttl=LONG_TTL), pg.connect(ttl=LONG_TTL)
    leading = Leading(a.election("e", identity="a"))
    term = await leading.leads()
    assert await leaders_row(pg, "e") == ("a", term.token)
    assert await pg.expire_shape("election", "e")
    with pytest.raises(LockLost):
        await asyncio.wait_for(leading.task, PROMPT)
    assert await leaders_row(pg, "e") == ("a", term.token), "the dead leader's row is still there"
    assert await reader.election("e").leader() is None
    other = await asyncpg.connect(pg.server.dsn)
    try:
        assert await other.fetchval("SELECT pg_try_advisory_lock($1::int4, $2::int4)", *election_key(pg.prefix, "e"))
        assert await reader.election("e").leader() is None, "a held key is not a leader without its live row"
    finally:
        await other.close()
    async with reader.election("e", identity="next").leadership() as new:
        leader = await reader.election("e").leader()
        assert leader is not None and (leader.identity, leader.token) == ("next", new.token)
        assert new.token is not None and term.token is not None and new.token > term.token
    assert await leaders_row(pg, "e") is None, "a resign deletes its row"


async def test_terms_one_after_another_on_one_shared_session_report_each_leader(pg: PostgresHarness) -> None:
    """Candidates of one client take the election on its one session in turn: the row of the
    term before (same session, same pid) is never reported for the next one."""
    locks, reader = pg.connect(ttl=LONG_TTL, max_leases=1), pg.connect(ttl=LONG_TTL)
    election = locks.election("e", identity="first")
    first = Leading(election)
    term1 = await first.leads()
    second = Leading(locks.election("e", identity="second"))
    changes = reader.election("e").observe()
    seen = await anext(changes)
    assert seen is not None and (seen.identity, seen.token) == ("first", term1.token)
    await election.resign()  # (from this task: the body is cancelled, its block ends quietly)
    await asyncio.wait_for(first.task, PROMPT)
    term2 = await second.leads()
    assert term2.token is not None and term1.token is not None and term2.token > term1.token
    async with asyncio.timeout(PROMPT):
        while (seen := await anext(changes)) is None:
            pass
    assert (seen.identity, seen.token) == ("second", term2.token)
    second.task.cancel()  # (leaving the block by cancellation releases the term)
    with contextlib.suppress(asyncio.CancelledError):
        await second.task
    assert await asyncio.wait_for(anext(changes), PROMPT) is None
    assert await leaders_row(pg, "e") is None
    await changes.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("source", ["sequence", "table"])
async def test_terms_take_the_locks_tokens_from_either_source(pg: PostgresHarness, source: str) -> None:
    """Each term's token comes from where the client's lock tokens come from (the sequence, or
    the counter table of servers before 15, in a row of the election's own) and increases."""
    clients = [tokens_from(pg.connect(ttl=LONG_TTL), source) for _ in range(2)]
    lock_tokens = []
    for _ in range(3):  # (the plain lock of the same name counts in a row of its own)
        async with clients[0].lock("e") as lease:
            assert lease.token is not None
            lock_tokens.append(lease.token)
    tokens: list[int] = []
    for i in range(4):
        election = clients[i % 2].election("e", identity=f"c{i}")
        async with election.leadership() as term:
            assert term.token is not None
            tokens.append(term.token)
            leader = await clients[(i + 1) % 2].election("e").leader()
            assert leader is not None and (leader.identity, leader.token) == (f"c{i}", term.token)
    assert tokens == sorted(set(tokens)), tokens
    if source == "table":
        assert tokens[0] <= lock_tokens[-1], "the election's counter is not the plain lock's of its name"


@pytest.fixture
async def role(pg: PostgresHarness) -> AsyncIterator[tuple[str, str]]:
    """A role of this test that logs in with a password: (name, password)."""
    async with password_role(pg) as created:
        yield created


async def test_a_role_that_may_not_create_or_write_the_leaders_table_gets_a_configuration_error(
    pg: PostgresHarness, role: tuple[str, str]
) -> None:
    """The leaders table is made on the first election's request (a client that only locks
    needs no CREATE for it): a refusal there is ConfigurationError at once, not a retry loop."""
    user, password = role
    owner = pg.connect(ttl=LONG_TTL)
    async with owner.lock("x"):  # (the fence table, its queue and sequence, made by a role that may)
        pass
    admin = await pg.admin()
    table = f"{pg.prefix}_fence"
    await admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{table}", "{table}_queue" TO {user}')
    await admin.execute(f'GRANT USAGE, SELECT, UPDATE ON "{table}_token", "{table}_queue_ticket_seq" TO {user}')
    limited = asynclock.connect(
        f"postgresql://{user}:{password}@127.0.0.1:{pg.server.port}/postgres", ttl=LONG_TTL, prefix=pg.prefix
    )
    insides.adopt(pg, limited)
    async with limited.lock("x") as lease:  # (locks need nothing more)
        assert lease.token is not None
    election = limited.election("e", identity="limited")
    # PostgreSQL 15 gives PUBLIC no CREATE on schema public: the table cannot be made.
    for attempt in (election.leader(), anext(election.observe()), _lead(election)):
        with pytest.raises(ConfigurationError, match="permission denied for schema public") as refused:
            await asyncio.wait_for(attempt, PATIENCE)
        assert f"{table}_leaders" in str(refused.value)  # the hint names the table
        assert refused.value.__cause__ is not None
    # The table exists (made by a client that may); the role may read it but not write it.
    assert await owner.election("e").leader() is None
    await admin.execute(f'GRANT SELECT ON "{table}_leaders" TO {user}')
    assert await election.leader() is None
    with pytest.raises(ConfigurationError, match=f"permission denied for table {table}_leaders"):
        await asyncio.wait_for(_lead(election), PATIENCE)
    try:
        async with asyncio.timeout(PROMPT):  # (what the refused statement took is let go of in the background)
            while await pg.granted_to(limited):
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"the refused candidate still holds {await pg.granted_to(limited)}") from None
    async with owner.election("e", identity="owner").leadership():  # (the key was let go of)
        leader = await election.leader()
        assert leader is not None and leader.identity == "owner"


async def _lead(election: asynclock.Election) -> None:
    async with election.leadership():
        pass


async def test_terms_tokens_keep_increasing_after_a_server_crash() -> None:
    """A crash resets the token sequence and empties the leaders table (both unlogged): the
    next term's token is still larger, and the lost leader is not reported."""
    server = PostgresServer()  # its own: this test crashes it
    try:
        server.start()
        async with asynclock.connect(server.url, ttl=LONG_TTL) as a, asynclock.connect(server.url, ttl=LONG_TTL) as b:
            leading = Leading(a.election("e", identity="a"))
            before = await leading.leads()
            server.restart(crash=True)
            with pytest.raises(LockLost):
                await asyncio.wait_for(leading.task, scaled(30))
            async with asyncio.timeout(scaled(30)):
                while True:
                    with contextlib.suppress(asynclock.BackendUnavailable):
                        assert await b.election("e").leader() is None
                        break
                    await asyncio.sleep(0.1)
                async with b.election("e", identity="b").leadership() as after:
                    assert before.token is not None and after.token is not None
                    assert after.token > before.token and after.token >= FLOOR
                    leader = await a.election("e").leader()
                    assert leader is not None and (leader.identity, leader.token) == ("b", after.token)
    finally:
        server.stop()
        server.cleanup()
