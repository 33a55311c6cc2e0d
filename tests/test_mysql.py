"""MySQL-only behaviour, on a real MariaDB: keys other clients share, shared sessions and the
session as the lease, waiting in the server, fencing tokens, and what configuration errors say.

Every test runs against the session's MariaDB (installed into a temp dir by
the fixture); a fresh prefix per test isolates keys and the fence table.
Tests that freeze or restart the server have one of their own.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockLost, LockTimeout
from asynclock.backends.mysql import MAX_KEY, election_key, lock_key, semaphore_key, slot_key
from tests.harnesses import insides
from tests.harnesses.mysql import MySQLHarness, mysql_parts, mysql_user, session_ids
from tests.servers import free_port, scaled
from tests.servers.mysql import MariaDBServer

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
#: Longer than anything here may take: a configuration error must come well before it.
PATIENCE = scaled(10)


@pytest.fixture
async def my(mysql_server: MariaDBServer) -> AsyncIterator[MySQLHarness]:
    harness = MySQLHarness(mysql_server)
    async with harness:
        yield harness


@pytest.fixture(scope="module")
def own_server() -> Iterator[MariaDBServer]:
    """A MariaDB these tests may freeze and restart (commits flushed at each one: a crash loses none)."""
    server = MariaDBServer(extra=["--innodb-flush-log-at-trx-commit=1"])
    server.start(timeout=60)
    yield server
    server.cleanup()


@pytest.fixture
async def own(own_server: MariaDBServer) -> AsyncIterator[MySQLHarness]:
    harness = MySQLHarness(own_server)
    async with harness:
        yield harness


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = scaled(5)) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def waiting_sessions(my: MySQLHarness, key: str) -> int:
    """Sessions whose statement waits in GET_LOCK for ``key`` (the process list)."""
    rows = await my.query(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"
        " AND STATE = 'User lock' AND INFO LIKE CONCAT('%%GET_LOCK(', QUOTE(%s), '%%')",
        (key,),
    )
    return int(rows[0][0])


# -- keys ----------------------------------------------------------------------------


def test_keys_are_the_name_as_it_is_or_a_hash_of_at_most_64_characters() -> None:
    assert lock_key("app", "orders:42") == "app:orders:42"
    assert lock_key("app", "x" * 60) == "app:" + "x" * 60  # 64 characters: as it is
    long = lock_key("app", "x" * 61)
    assert len(long) <= MAX_KEY and long.startswith("app:#l")
    assert lock_key("app", "x" * 61 + "y") != long
    for odd in ("#x", "tab\there", "emoji 🔒", "nul\0"):
        key = lock_key("app", odd)
        assert key.startswith("app:#l") and len(key) <= MAX_KEY, odd
    assert len({lock_key("app", odd) for odd in ("#x", "#y", "emoji 🔒", "emoji 🔓")}) == 4
    assert lock_key("p" * 80, "n").startswith("p" * 24 + ":#l")  # the prefix is kept in part
    assert lock_key("p" * 80, "n") != lock_key("p" * 79, "n")
    assert election_key("app", "lead") == "app:#e:lead"
    assert election_key("app", "lead") != lock_key("app", "#e:lead")
    assert slot_key("app", "gpu", 2) == semaphore_key("app", "gpu") + "#2"
    assert all(len(slot_key("p" * 80, "n" * 500, slot)) <= MAX_KEY for slot in (0, 99999))


# -- another ecosystem's client shares the locks --------------------------------------------


class CliSession:
    """A ``mariadb`` command-line client, fed statements one at a time, answering a line each."""

    def __init__(self, server: MariaDBServer) -> None:
        self.proc = subprocess.Popen(
            server.client_command("-N", "-B", "--unbuffered"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    async def ask(self, statement: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(statement.rstrip(";") + ";\n")
        self.proc.stdin.flush()
        return (await asyncio.to_thread(self.proc.stdout.readline)).strip()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def cli(my: MySQLHarness) -> Iterator[CliSession]:
    session = CliSession(my.server)
    try:
        yield session
    finally:
        session.close()


@pytest.mark.parametrize("name", ["orders:42", "a name far longer than what GET_LOCK takes as it is, " * 2])
async def test_the_mariadb_client_and_asynclock_exclude_each_other_on_info_key(
    my: MySQLHarness, cli: CliSession, name: str
) -> None:
    locks = my.connect(ttl=TTL)
    lock = locks.lock(name)
    key = lock.key
    assert key == (await lock.info()).key == lock_key(my.prefix, name) and len(key) <= MAX_KEY
    quoted = "'" + key.replace("'", "''") + "'"
    # the command-line client holds it: asynclock waits, and gets it when the client lets go
    assert await cli.ask(f"SELECT GET_LOCK({quoted}, 0)") == "1"
    info = await lock.info()
    assert info.owner is not None and info.owner.startswith("connection ") and info.token is None
    assert await locks.check(name, 1) is False  # a foreign holder has no token: none of ours is current
    with pytest.raises(LockTimeout):
        await lock.acquire(timeout=0)
    waiting = asyncio.create_task(lock.acquire(timeout=scaled(10), detached=True))
    await until(lambda: _waits(my, key, 1), "asynclock waits in the server")
    assert await cli.ask(f"SELECT RELEASE_LOCK({quoted})") == "1"
    lease = await asyncio.wait_for(waiting, scaled(5))
    # asynclock holds it: the client is refused, and a client that waits gets it at the release
    assert await cli.ask(f"SELECT GET_LOCK({quoted}, 0)") == "0"
    answer = asyncio.create_task(cli.ask(f"SELECT GET_LOCK({quoted}, 30)"))
    await until(lambda: _waits(my, key, 1), "the client waits in the server")
    assert not answer.done()
    await lease.release()
    assert await asyncio.wait_for(answer, scaled(5)) == "1"
    assert await cli.ask(f"SELECT RELEASE_LOCK({quoted})") == "1"


async def _waits(my: MySQLHarness, key: str, count: int) -> bool:
    return await waiting_sessions(my, key) == count


async def test_names_lists_the_locks_held_under_the_prefix_by_any_client(my: MySQLHarness, cli: CliSession) -> None:
    locks = my.connect(ttl=TTL)
    long_name = "a name far longer than what GET_LOCK takes as it is, " * 2
    assert await cli.ask(f"SELECT GET_LOCK('{my.prefix}:by-the-client', 0)") == "1"
    assert await cli.ask(f"SELECT GET_LOCK('{my.prefix}x:another-prefix', 0)") == "1"
    async with locks.lock("ours"), locks.lock(long_name):
        # (ours from the fence table, the client's from the server's table of named locks)
        assert await locks.backend.names() == sorted(["ours", long_name, "by-the-client"])  # type: ignore[attr-defined]
    assert await locks.backend.names() == ["by-the-client"]  # type: ignore[attr-defined]


async def test_an_owner_with_a_very_long_task_name_holds_and_lets_go(my: MySQLHarness) -> None:
    locks, other = my.connect(ttl=TTL), my.connect(ttl=TTL)

    async def hold() -> str | None:
        async with locks.lock("long-owner"):
            return (await other.lock("long-owner").info()).owner

    owner = await asyncio.create_task(hold(), name="t" * 2000)
    assert owner is not None and owner.startswith(locks.client_id) and len(owner) <= 1024
    async with other.lock("long-owner").acquire(timeout=0):
        pass


# -- shared sessions, and the session as the lease -----------------------------------------


async def test_holds_share_sessions_and_a_killed_session_loses_exactly_its_holds(my: MySQLHarness) -> None:
    # Thirty holds taken at once share at most max_leases sessions; a hold won by waiting
    # holds on the session that waited. KILL of one session loses the holds on it, each
    # with a "lost" event (LockLost for a body under it); the others keep theirs.
    events: list[asynclock.LockEvent] = []
    # (only a KILL can lose these within the test; the watchdog pings every second, scaled)
    locks = my.connect(ttl=scaled(3), max_leases=3, on_event=events.append)
    other = my.connect(ttl=TTL)
    names = [f"share-{i}" for i in range(30)]
    leases = await asyncio.wait_for(
        asyncio.gather(*(locks.lock(name).acquire(detached=True) for name in names)), scaled(10)
    )
    by_name = dict(zip(names, leases, strict=True))
    blocker = await other.lock("waited").acquire()
    waited = asyncio.create_task(locks.lock("waited").acquire(detached=True))
    await until(lambda: _waits(my, lock_key(my.prefix, "waited"), 1), "the waiter waits")
    await other.lock("waited").release()
    by_name["waited"] = await asyncio.wait_for(waited, scaled(5))
    assert blocker.token is not None and by_name["waited"].token == blocker.token + 1
    on: dict[int, list[str]] = {}
    for name in by_name:
        holder = await my.holder_id(lock_key(my.prefix, name))
        assert holder is not None
        on.setdefault(holder, []).append(name)
    assert 2 <= len(on) <= 4, on  # shared: three at most for the thirty, one more for the waited one
    assert set(on) <= set(session_ids(locks))
    victim = next(holder for holder, held in on.items() if "share-0" in held)
    gone = on[victim]
    kept = [name for name in by_name if name not in gone]
    await my.kill(victim)
    # (found out at the session's next request: the watchdog's ping, a ttl/3 at most)
    for name in gone:
        reason = await asyncio.wait_for(by_name[name].wait_lost(), scaled(5))
        assert "closed" in reason
    lost = {event.name for event in events if event.kind == "lost"}
    assert lost == set(gone)
    for name in kept:
        assert not by_name[name].lost
        with pytest.raises(LockTimeout):
            await other.lock(name).acquire(timeout=0)
    for name in gone:
        async with other.lock(name) as lease:
            assert lease.token is not None and lease.token > (by_name[name].token or 0)
    for name in kept:
        await by_name[name].release()


async def test_a_hung_holders_session_is_ended_by_the_server_after_its_ttl(my: MySQLHarness) -> None:
    # The session's wait_timeout is the ttl (whole seconds): a holder that stops
    # pinging loses its session, and its locks, that long after its last request.
    hung = my.connect(ttl=TTL)
    other = my.connect(ttl=TTL)
    lease = await hung.lock("hung").acquire()
    await insides.stop_renewing(hung)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(scaled(10)), other.lock("hung") as taken:
        assert taken.token is not None and lease.token is not None and taken.token > lease.token
    assert loop.time() - started <= max(TTL, 1.0) + scaled(1.0)  # (whole seconds, at least one)


async def test_twenty_waiters_wait_on_one_session_and_get_it_in_line_order(my: MySQLHarness) -> None:
    holder = my.connect(ttl=TTL)
    waiter = my.connect(ttl=TTL)
    held = await holder.lock("twenty").acquire()
    order: list[int] = []

    async def wait_then_release(i: int) -> None:
        lease = await waiter.lock("twenty").acquire(timeout=scaled(30), detached=True)
        order.append(i)
        await lease.release()

    tasks = []
    for i in range(20):
        tasks.append(asyncio.create_task(wait_then_release(i)))
        # (its own client knows its whole line; another sees one waiting session per client)
        await until(lambda i=i: _waiters(waiter, "twenty", i + 1), f"{i + 1} waiters")
    key = lock_key(my.prefix, "twenty")
    assert await waiting_sessions(my, key) == 1  # one session waits in the server for the line
    parts = mysql_parts(waiter)
    assert parts is not None and len(parts.sessions) <= 2
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), scaled(30))
    assert order == list(range(20))
    await until(lambda: _waits(my, key, 0), "nobody waits")


async def _waiters(locks: asynclock.Locks, name: str, count: int) -> bool:
    return (await locks.lock(name).info()).waiters == count


async def test_the_next_waiter_is_woken_by_the_release_at_once(my: MySQLHarness) -> None:
    holder = my.connect(ttl=scaled(30))  # a long ttl: only the release can let the waiter in
    waiter = my.connect(ttl=scaled(30))
    lock = holder.lock("handoff")
    await lock.acquire()
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(waiter.lock("handoff").acquire(detached=True))
    await until(lambda: _waits(my, lock.key, 1), "the waiter waits")
    released = loop.time()
    await lock.release()
    lease = await asyncio.wait_for(task, scaled(2))
    assert loop.time() - released < scaled(0.5)
    await lease.release()


async def test_a_cancelled_waiter_leaves_no_wait_and_no_grant_behind(my: MySQLHarness) -> None:
    holder, waiter, third = my.connect(ttl=TTL), my.connect(ttl=TTL), my.connect(ttl=TTL)
    lock = holder.lock("gone")
    await lock.acquire()
    task = asyncio.create_task(waiter.lock("gone").acquire())
    await until(lambda: _waits(my, lock.key, 1), "the waiter waits")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: _waits(my, lock.key, 0), "its wait is ended (KILL QUERY)")
    await lock.release()
    async with third.lock("gone").acquire(timeout=0) as lease:  # nobody got it meanwhile
        assert lease.token is not None
    assert not waiter.lock("gone").held


async def test_a_semaphore_waiter_waits_on_every_slot_and_leaves_none_waiting_once_granted(my: MySQLHarness) -> None:
    # (the waiter's long ttl makes each wait statement long: only an end of the waits leaves none soon)
    holder, waiter = my.connect(ttl=TTL), my.connect(ttl=scaled(10))
    first = await holder.semaphore("gpu", permits=2).acquire(detached=True)
    second = await holder.semaphore("gpu", permits=2).acquire(detached=True)
    slots = [slot_key(my.prefix, "gpu", slot) for slot in range(2)]

    async def waits_on_both() -> bool:
        return all([await _waits(my, slot, 1) for slot in slots])

    task = asyncio.create_task(waiter.semaphore("gpu", permits=2).acquire(detached=True))
    await until(waits_on_both, "the waiter waits on both slots")
    await second.release()
    lease = await asyncio.wait_for(task, scaled(5))
    assert second.token is not None and lease.token is not None and lease.token > second.token

    async def none_waits() -> bool:
        return all([await _waits(my, slot, 0) for slot in slots])

    await until(none_waits, "no wait is left on the other slot", timeout=scaled(2))
    await lease.release()
    await first.release()


async def test_a_lease_won_after_a_long_wait_counts_from_the_grant(my: MySQLHarness) -> None:
    holder = my.connect(ttl=TTL)
    waiter = my.connect(ttl=TTL)
    loop = asyncio.get_running_loop()
    lock = holder.lock("long")
    await lock.acquire()
    task = asyncio.create_task(waiter.lock("long").acquire(detached=True))
    await until(lambda: _waits(my, lock.key, 1), "the waiter waits")
    await asyncio.sleep(TTL * 2)  # longer than the waiter's whole ttl, and than one wait statement
    await lock.release()
    lease = await asyncio.wait_for(task, scaled(5))
    assert lease.expires_at > loop.time()
    await asyncio.sleep(TTL * 1.5)  # and the watchdog keeps it
    assert not lease.lost and await my.holder_id(lock.key) is not None
    await lease.release()


# -- tokens ----------------------------------------------------------------------------


async def test_tokens_increase_across_clients_and_client_restarts(my: MySQLHarness) -> None:
    seen: list[int] = []
    for _ in range(3):
        async with my.open(ttl=TTL, prefix=my.prefix) as locks:
            for client in (locks, my.connect(ttl=TTL)):
                async with client.lock("t") as lease:
                    assert lease.token is not None
                    seen.append(lease.token)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


async def test_tokens_keep_increasing_after_a_server_crash(own: MySQLHarness) -> None:
    locks = own.connect(ttl=TTL)
    async with locks.lock("crash") as lease:
        before = lease.token
    for crash in (True, False):
        await asyncio.to_thread(own.server.restart, crash=crash)
        async with asyncio.timeout(scaled(20)), locks.lock("crash") as lease:
            assert lease.token is not None and before is not None and lease.token > before
            before = lease.token


async def test_a_semaphore_client_with_other_permits_gets_value_error_and_leaves_nothing(my: MySQLHarness) -> None:
    a, b = my.connect(ttl=TTL), my.connect(ttl=TTL)
    sem = a.semaphore("gpu", permits=3)
    async with sem:
        with pytest.raises(ValueError, match=r"permits=3.*permits=2"):
            await asyncio.wait_for(b.semaphore("gpu", permits=2).acquire(), PATIENCE)
        with pytest.raises(ValueError, match=r"permits=3.*permits=2"):
            await asyncio.wait_for(b.semaphore("gpu", permits=2).acquire(timeout=0), PATIENCE)
        info = await sem.info()
        assert len(info.holders) == 1 and not info.waiters
    async with b.semaphore("gpu", permits=2) as lease:  # nobody uses it any more: a new number is fine
        assert lease.token is not None


# -- the server away -------------------------------------------------------------------


async def test_paused_server_cancels_the_holder_before_its_deadline(own: MySQLHarness) -> None:
    locks = own.connect(ttl=TTL)
    seen: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(LockLost):
            async with locks.lock("stop") as lease:
                await asyncio.sleep(TTL / 6)
                own.server.pause()
                seen["paused_at"] = loop.time()
                await asyncio.sleep(scaled(20))
    finally:
        own.server.resume()
    assert lease.lost and "deadline" in (lease.lost_reason or "")
    other = own.connect(ttl=TTL)
    async with asyncio.timeout(scaled(10)), other.lock("stop") as successor:
        assert successor.token is not None and lease.token is not None and successor.token > lease.token


async def test_a_waiter_on_a_silent_server_is_not_left_waiting_forever(own: MySQLHarness) -> None:
    holder = own.connect(ttl=scaled(30))
    waiter = own.connect(ttl=TTL)
    async with holder.lock("silent"):
        task = asyncio.create_task(waiter.lock("silent").acquire())  # timeout=None
        await until(lambda: _waits(own, lock_key(own.prefix, "silent"), 1), "the waiter waits")
        own.server.pause()
        try:
            async with asyncio.timeout(scaled(15)):
                with pytest.raises(BackendUnavailable) as caught:
                    await task
        finally:
            own.server.resume()
    assert f"127.0.0.1:{own.server.port}" in str(caught.value)


# -- configuration -----------------------------------------------------------------------


async def refused(locks: asynclock.Locks, name: str = "x") -> ConfigurationError:
    """The ConfigurationError of an acquire that would wait forever (it must come at once instead)."""
    with pytest.raises(ConfigurationError) as caught:
        await asyncio.wait_for(locks.lock(name).acquire(timeout=None), PATIENCE)
    assert caught.value.__cause__ is not None and not type(caught.value).__module__.startswith("asyncmy")
    return caught.value


async def test_a_refused_password_or_database_is_a_configuration_error_naming_no_password(my: MySQLHarness) -> None:
    async with mysql_user(my) as (user, password):
        wrong = f"not-{password}"
        for locks in (
            asynclock.connect(my.server.url_for(user, wrong), ttl=TTL),
            asynclock.connect(my.server.url_for(user), ttl=TTL, password=wrong),
            asynclock.connect(my.server.url_for(user, password, database=f"{my.prefix}_nowhere"), ttl=TTL),
        ):
            insides.adopt(my, locks)
            error = await refused(locks)
            text = str(error)
            assert f"127.0.0.1:{my.server.port}" in text and "Access denied" in text  # the server's words
            assert wrong not in text and password not in text
        good = asynclock.connect(my.server.url_for(user, password), ttl=TTL, prefix=my.prefix)
        insides.adopt(my, good)
        async with good.lock("x") as lease:
            assert isinstance(lease.token, int)
    root = asynclock.connect(my.server.url_for("root", database=f"{my.prefix}_nowhere"), ttl=TTL)
    insides.adopt(my, root)
    assert "Unknown database" in str(await refused(root))


async def test_a_missing_privilege_is_raised_at_once_and_leaves_nothing(my: MySQLHarness) -> None:
    async with mysql_user(my, "SELECT") as (user, password):
        limited = asynclock.connect(my.server.url_for(user, password), ttl=TTL, prefix=my.prefix)
        insides.adopt(my, limited)
        error = await refused(limited)  # the fence table cannot be made
        assert "CREATE command denied" in str(error) and f"{my.prefix}_fence" in str(error)
        owner = my.connect(ttl=TTL)
        holder = owner.lock("taken")
        await holder.acquire()  # (the table is there now; the user may read it, not write it)
        error = await refused(limited, "free")
        assert "INSERT, UPDATE command denied" in str(error)
        error = await refused(limited, "taken")  # a wait behind a held lock does not hide it
        assert "command denied" in str(error)
        with pytest.raises(ConfigurationError, match="denied"):
            await asyncio.wait_for(limited.semaphore("gpu", permits=2).acquire(timeout=None), PATIENCE)
        assert (await holder.info()).waiters == 0
        assert await my.holder_id(lock_key(my.prefix, "free")) is None
        await holder.release()


async def test_a_refused_connection_fails_within_connect_timeout() -> None:
    loop = asyncio.get_running_loop()
    port = free_port()
    locks = asynclock.connect(f"mysql://root@127.0.0.1:{port}/db", ttl=TTL, connect_timeout=scaled(2))
    try:
        started = loop.time()
        with pytest.raises(BackendUnavailable) as caught:
            await asyncio.wait_for(locks.lock("x").acquire(timeout=None), PATIENCE)
        assert loop.time() - started < scaled(4)
        assert f"127.0.0.1:{port}" in str(caught.value) and "refused" in str(caught.value)
    finally:
        await locks.aclose()


async def test_urls_and_options_are_checked_before_any_io(my: MySQLHarness) -> None:
    nowhere = f"mysql://root@127.0.0.1:{free_port()}/db"
    for url, options, wrong in (
        (f"{nowhere}?max_lease=3", {}, "max_lease"),
        (f"{nowhere}?tabel=t", {}, "tabel"),
        (nowhere, {"max_lease": 3}, "max_lease"),
        (nowhere, {"charset": "latin1"}, "charset"),
    ):
        with pytest.raises(ValueError, match=repr(wrong)):
            asynclock.connect(url, **options)
    with pytest.raises(ValueError, match="database"):
        asynclock.connect(f"mysql://root@127.0.0.1:{free_port()}/")
    with pytest.raises(ValueError, match="max_leases"):
        asynclock.connect(f"{nowhere}?max_leases=0")
    # mariadb:// is the same backend, and table= names the fence table
    url = my.server.url.replace("mysql://", "mariadb://") + f"?table={my.prefix}_fence&max_leases=1"
    async with asynclock.connect(url, ttl=TTL, prefix=my.prefix) as locks:
        async with locks.lock("m") as lease:
            assert lease.token == 1
            assert await my.holder_id(lock_key(my.prefix, "m")) is not None
        assert mysql_parts(locks) is not None
        assert locks.backend.max_leases == 1  # type: ignore[attr-defined]
    # through the server's unix socket (a host that does not exist shows it is not used)
    socket_url = f"mysql://root@nowhere.invalid/asynclock?unix_socket={my.server.socket_path}"
    async with asynclock.connect(socket_url, ttl=TTL, prefix=my.prefix) as locks:
        async with locks.lock("m") as lease:
            assert lease.token == 2


async def test_read_write_locks_are_refused_before_any_io() -> None:
    locks = asynclock.connect(f"mysql://root@127.0.0.1:{free_port()}/db")
    with pytest.raises(NotImplementedError, match="shared mode"):
        locks.rw_lock("x")
    await locks.aclose()
