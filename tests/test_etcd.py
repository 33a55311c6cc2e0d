"""etcd-specific behaviour: the Mutex layout and ``etcdctl lock`` interop both ways,
the lease (a paused or dead cluster cancels the body before etcd could expire
the lease), failover in a three-member cluster, and configuration errors.
(The contract suite runs on etcd too: tests/test_contract.py.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import asynclock
from asynclock import BackendUnavailable, ConfigurationError, LockLost
from asynclock.abc import LockRef
from asynclock.backends.etcd import EtcdBackend, _recipe, _watch
from asynclock.backends.etcd._client import _KV
from asynclock.backends.etcd._replies import Created, TxnResult, deleted_count
from asynclock.backends.etcd._wire import Op, range_request, txn_request
from tests.harnesses import eventually, insides
from tests.harnesses.etcd import AdminClient, EtcdHarness, etcd_queue
from tests.servers import free_port, scaled
from tests.servers.etcd import EtcdCluster, EtcdServer, TlsFiles, etcdctl, etcdctl_binary

pytestmark = pytest.mark.anyio

TTL = scaled(1.0)


@pytest.fixture
async def harness(etcd_server: EtcdServer) -> AsyncIterator[EtcdHarness]:
    async with EtcdHarness(etcd_server) as h:
        yield h


@pytest.fixture
def etcd_fresh() -> Iterator[EtcdServer]:
    """An etcd of its own, for tests that pause or kill it."""
    server = EtcdServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


def backend(locks: asynclock.Locks) -> EtcdBackend:
    found = locks.backend
    assert isinstance(found, EtcdBackend)
    return found


async def etcdctl_lock(server: EtcdServer, key: str, *command: str) -> asyncio.subprocess.Process:
    """``etcdctl lock <key> -- <command>``, started (it holds the lock while the command runs)."""
    binary = etcdctl_binary()
    assert binary is not None
    return await asyncio.create_subprocess_exec(
        binary,
        f"--endpoints={server.endpoint}",
        "lock",
        key,
        "--",
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ETCDCTL_API": "3"},
    )


# -- layout ------------------------------------------------------------------------------


async def test_the_lock_is_the_mutex_key_of_the_clients_lease(harness: EtcdHarness) -> None:
    """``<lock.key>/<lease id in hex>``, created with the lease; the token is its create revision."""
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("orders/42")
    assert lock.key == f"{harness.prefix}/orders%2F42"
    async with lock as lease:
        admin = await harness.admin()
        keys = await admin.keys(lock.key + "/")
        lease_id = backend(locks).lease_id
        assert [kv.key.decode() for kv in keys] == [f"{lock.key}/{lease_id:x}"]
        assert keys[0].lease == lease_id
        assert lease.token == keys[0].create_revision
    assert await (await harness.admin()).keys(lock.key + "/") == []


async def test_tasks_of_one_client_take_turns_for_its_one_key(harness: EtcdHarness) -> None:
    """Go's Mutex has one key per lease: a second task of the client waits in the
    client, not as a second key, and its turn puts the key anew (a higher token)."""
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("turns")
    admin = await harness.admin()
    first = await lock.acquire()
    got: list[int | None] = []

    async def second() -> None:
        async with lock as lease:
            got.append(lease.token)

    task = asyncio.create_task(second())
    await asyncio.sleep(0.1)
    assert not got
    assert len(await admin.keys(lock.key + "/")) == 1
    assert (await lock.info()).waiters == 1  # counted in the client
    await lock.release()
    await asyncio.wait_for(task, scaled(5))
    assert first.token is not None and got[0] is not None and got[0] > first.token


async def test_a_lock_ttl_past_the_clients_lease_is_refused(harness: EtcdHarness) -> None:
    locks = harness.connect(ttl=TTL)
    with pytest.raises(ValueError, match="client's ttl"):
        await locks.lock("long", ttl=10 * TTL).acquire()


def test_url_path_and_prefix_make_the_mutex_prefix() -> None:
    with_path = EtcdBackend.from_url("etcds://u:secret@a:1,b:2/app/locks", prefix="svc")
    assert with_path.lock_key(LockRef("lock", "x")) == "/app/locks/svc/x"
    assert EtcdBackend.from_url("etcd://a", prefix="/locks").lock_key(LockRef("fair", "job 1")) == "/locks/job 1"
    assert EtcdBackend.from_url("etcd://a").lock_key(LockRef("lock", "%/\n")) == "asynclock/%25%2F%0A"


def test_a_name_segment_encodes_exactly_percent_slash_and_control_characters() -> None:
    """Printable names are used as they are; every other name is encoded character by
    character, so both give what the rule gives (``etcdctl lock`` users type these keys)."""
    names = ["", "x", "job 1", "é/ü", "a%b", "tab\there", "del\x7f", "nel\x85", "nul\x00", "\u2028", "日本/語"]
    for name in names:
        by_rule = "".join(f"%{ord(c):02X}" if c in "%/" or ord(c) < 0x20 or ord(c) == 0x7F else c for c in name)
        assert _recipe.escape_name(name) == by_rule, name
        assert _recipe.unescape_name(_recipe.escape_name(name)) == name


def test_unknown_options_are_refused_before_any_io() -> None:
    with pytest.raises(ValueError, match="did you mean 'user'"):
        asynclock.connect(f"etcd://127.0.0.1:{free_port()}?usr=me")
    with pytest.raises(ValueError, match="did you mean 'ca_file'"):
        asynclock.connect("etcds://127.0.0.1:1", ca_fil="/x")
    with pytest.raises(ValueError, match="TLS option"):
        asynclock.connect("etcd://127.0.0.1:1?ca_file=/x")


# -- the answers the hot path reads -----------------------------------------------------------

#: Which fields of etcd's answers are messages (field number -> the message's own
#: schema): TxnResponse's header and ResponseOps, a ResponseOp's range, put and
#: delete responses, a RangeResponse's header and KeyValues.
_HEADER: dict[int, Any] = {}
_RANGE = {1: _HEADER, 2: {}}
_TXN = {1: _HEADER, 3: {1: _RANGE, 2: {1: _HEADER}, 3: {1: _HEADER}}}
_DELETE = {1: _HEADER}

#: Fields no etcd message here has, one of each wire type (a two-byte tag, a
#: ten-byte varint, a length-delimited, a 64-bit and a 32-bit value).
_UNKNOWN = [(99, 0, (1 << 64) - 1), (100, 2, b"\x08\x96\x01 unknown"), (101, 1, b"8 bytes!"), (102, 5, b"4byt")]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, offset


def _scramble(data: bytes, schema: dict[int, Any]) -> bytes:
    """``data`` re-encoded as another valid protobuf writer may send it: fields by
    descending number (a repeated field's items keep their order), unknown fields of
    every wire type before and after, and the same done inside every known message."""
    fields: list[tuple[int, int, Any]] = []
    offset = 0
    while offset < len(data):
        tag, offset = _read(data, offset)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            value, offset = _read(data, offset)
            fields.append((number, 0, value))
        elif kind == 2:
            size, offset = _read(data, offset)
            body = data[offset : offset + size]
            offset += size
            fields.append((number, 2, _scramble(body, schema[number]) if number in schema else body))
        else:
            raise AssertionError(f"etcd sent wire type {kind}")
    fields.sort(key=lambda field: -field[0])
    out = bytearray()
    for number, kind, value in [*_UNKNOWN[:2], *fields, *_UNKNOWN[2:]]:
        out += _varint(number << 3 | kind)
        if kind == 0:
            out += _varint(value)
        elif kind == 2:
            out += _varint(len(value)) + value
        else:
            out += value
    return bytes(out)


async def test_the_create_and_delete_answers_are_read_by_field_number_whatever_else_they_carry(
    harness: EtcdHarness,
) -> None:
    """The acquire reads only a few fields of the creating transaction's answer (whether the
    put ran, the revision, the first create revision each range found), the release only the
    count of a delete's: read from etcd's real answers, and from the same answers with their
    fields in another order and unknown fields of every wire type added, they give what etcd
    holds. The key is written again before it is created a second time, so a create
    revision mixed up with a mod revision, or a header's revision with a key's, shows."""
    client = (await harness.admin()).client
    lease = 0x5EED_0000_0000_0001
    await client.grant(60, lease, 5.0)
    other = lease + 2
    await client.grant(60, other, 5.0)
    try:
        prefix = f"{harness.prefix}/answers"
        mine, theirs = _recipe.mutex(prefix, lease), _recipe.mutex(prefix, other)

        async def create(contender: _recipe.Contender) -> bytes:
            return await client.call(_KV + "Txn", contender.create, 5.0)

        async def create_revision(key: bytes) -> int:
            (kv,) = (await client.range(range_request(key), 5.0)).kvs
            return kv.create_revision

        put_first = await create(mine)
        first = await create_revision(mine.key)
        rewritten = await client.txn([], [Op.put(mine.key, b"written again", lease=lease)], timeout=5.0)
        put_again = await create(mine)
        put_second = await create(theirs)
        second = await create_revision(theirs.key)
        assert first < rewritten.header.revision < second

        expected = [
            (put_first, Created(True, first, (None, first))),
            (put_again, Created(False, rewritten.header.revision, (first, first))),
            (put_second, Created(True, second, (None, first))),
        ]
        for answer, created in expected:
            assert TxnResult.parse(answer).succeeded is created.succeeded  # (the full reader agrees)
            assert Created.parse(answer) == created
            assert Created.parse(_scramble(answer, _TXN)) == created
        assert Created.parse(put_again).first(1) == first
        with pytest.raises(ValueError, match="no range"):
            Created.parse(put_first).first(0)  # a put's response

        deleted = await client.call(_KV + "DeleteRange", theirs.remove, 5.0)
        none_left = await client.call(_KV + "DeleteRange", theirs.remove, 5.0)
        assert [deleted_count(deleted), deleted_count(_scramble(deleted, _DELETE))] == [1, 1]
        assert [deleted_count(none_left), deleted_count(_scramble(none_left, _DELETE))] == [0, 0]
    finally:
        await client.revoke(lease, 5.0)
        await client.revoke(other, 5.0)


async def test_a_transactions_answer_has_one_response_per_op_whatever_else_they_carry(harness: EtcdHarness) -> None:
    """The full reader (a waiter's check, the renewals' reads) gives each op of the branch
    that ran its one response, in order, however the answer's fields are laid out and
    whatever unknown fields a ResponseOp carries."""
    client = (await harness.admin()).client
    lease = 0x5EED_0000_0000_0011
    await client.grant(60, lease, 5.0)
    try:
        key = f"{harness.prefix}/reads/a".encode()
        put = await client.txn([], [Op.put(key, b"v", lease=lease)], timeout=5.0)
        request = txn_request([], [Op.range(key), Op.range(key + b"/absent"), Op.delete(key + b"/absent")])
        answer = await client.call(_KV + "Txn", request, 5.0)

        def shape(result: TxnResult) -> tuple[bool, int, list[tuple[int, list[int], int]]]:
            return (
                result.succeeded,
                result.header.revision,
                [(kind, [kv.create_revision for kv in found.kvs], found.count) for kind, found in result.responses],
            )

        expected = (True, put.header.revision, [(1, [put.header.revision], 1), (1, [], 0), (3, [], 0)])
        assert shape(TxnResult.parse(answer)) == expected
        assert shape(TxnResult.parse(_scramble(answer, _TXN))) == expected
    finally:
        await client.revoke(lease, 5.0)


# -- interop with etcdctl lock -------------------------------------------------------------


async def test_etcdctl_holds_and_asynclock_waits_until_its_command_ends(
    harness: EtcdHarness, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("shared-with-go")
    admin = await harness.admin()
    ended = tmp_path / "ended"
    # etcdctl deletes its key once the command ends, and exits after that
    proc = await etcdctl_lock(etcd_server, lock.key, "sh", "-c", f"sleep {scaled(1.0)}; touch {ended}")
    exited = asyncio.create_task(proc.wait())
    try:
        async with asyncio.timeout(scaled(10)):
            while not await admin.keys(lock.key + "/"):
                await asyncio.sleep(0.01)
        theirs = (await admin.keys(lock.key + "/"))[0]
        async with lock as lease:
            assert ended.exists(), "asynclock got the lock while etcdctl's command ran"
            assert lease.token is not None and lease.token > theirs.create_revision
        assert await exited == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        await exited


async def test_asynclock_holds_and_etcdctl_waits_until_the_release(
    harness: EtcdHarness, etcd_server: EtcdServer
) -> None:
    locks = harness.connect(ttl=TTL)
    lock = locks.lock("shared-with-go")
    admin = await harness.admin()
    async with lock as lease:
        proc = await etcdctl_lock(etcd_server, lock.key, "sh", "-c", 'echo "got $ETCD_LOCK_KEY"')
        try:
            async with asyncio.timeout(scaled(10)):
                while len(await admin.keys(lock.key + "/")) < 2:
                    await asyncio.sleep(0.01)  # etcdctl queued behind us
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), scaled(0.5))
            assert (await lock.info()).waiters == 1
            assert lease.token == (await admin.keys(lock.key + "/"))[0].create_revision
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
    out, err = await asyncio.wait_for(proc.communicate(), scaled(10))
    assert proc.returncode == 0, err
    assert out.decode().startswith(f"got {lock.key}/")


# -- the semaphore's permits, one number per semaphore ------------------------------------


async def test_a_semaphore_whose_permits_are_all_taken_refuses_another_number_before_waiting(
    harness: EtcdHarness,
) -> None:
    """Each lease key records its client's permits. A client asking with fewer, when every
    permit it knows of is taken (it would queue), is refused at once, and leaves no key."""
    first, second, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    admin = await harness.admin()
    sem = first.semaphore("gpu", permits=2)
    async with sem, second.semaphore("gpu", permits=2):
        leases = await admin.keys(f"{sem.key}/leases/")
        values = [(await admin.client.range(range_request(kv.key), 5.0)).kvs[0].value for kv in leases]
        assert values == [b"asynclock permits=2"] * 2
        with pytest.raises(ValueError, match=r"permits=2.*permits=1"):
            await asyncio.wait_for(other.semaphore("gpu", permits=1).acquire(), scaled(5))
        assert len(await admin.keys(f"{sem.key}/leases/")) == 2
        assert await admin.keys(f"{sem.key}/locks/") == []
    async with other.semaphore("gpu", permits=1):  # nobody uses it any more: a new number is fine
        with pytest.raises(ValueError, match=r"permits=1.*permits=2"):
            await sem.acquire(timeout=0)


# -- elections: etcd's concurrency.Election, with etcdctl elect -----------------------------


async def etcdctl_elect(server: EtcdServer, *args: str) -> asyncio.subprocess.Process:
    """``etcdctl elect <args>``, started: ``NAME PROPOSAL`` campaigns (prints the key and the
    proposal once it leads, resigns on SIGTERM); ``-l NAME`` prints each leader's key and value."""
    binary = etcdctl_binary()
    assert binary is not None
    return await asyncio.create_subprocess_exec(
        binary,
        f"--endpoints={server.endpoint}",
        "elect",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ETCDCTL_API": "3"},
    )


async def printed(proc: asyncio.subprocess.Process, lines: int) -> list[str]:
    """The next ``lines`` lines ``proc`` prints (bounded)."""
    assert proc.stdout is not None
    async with asyncio.timeout(scaled(10)):
        return [(await proc.stdout.readline()).decode().rstrip("\n") for _ in range(lines)]


async def stopped(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM (etcdctl elect resigns then) and the exit code."""
    if proc.returncode is None:
        proc.terminate()
    async with asyncio.timeout(scaled(10)):
        return await proc.wait()


async def test_an_election_is_the_go_election_key_of_the_clients_lease(harness: EtcdHarness) -> None:
    """``<election.key>/<lease id in hex>`` holding the identity, created with the lease;
    the token is its create revision; the election is not listed among the locks."""
    locks = harness.connect(ttl=TTL)
    election = locks.election("jobs/sched", identity="replica-7 ✓")
    assert election.key == f"{harness.prefix}/%election/jobs%2Fsched"
    admin = await harness.admin()
    async with election.leadership() as term:
        (kv,) = await admin.keys(election.key + "/")
        assert kv.key.decode() == f"{election.key}/{backend(locks).lease_id:x}"
        assert (kv.lease, kv.create_revision) == (backend(locks).lease_id, term.token)
        value = (await admin.client.range(range_request(kv.key), 5.0)).kvs  # (a get of the key: its value too)
        assert value[0].value == "replica-7 ✓".encode()
        assert await backend(locks).names() == []
    assert await admin.keys(election.key + "/") == []


async def test_observe_sees_every_term_even_those_that_ended_before_it_looked(harness: EtcdHarness) -> None:
    """The observer follows the watch's events, not a read after each one: two terms that
    begin and end while it reads nothing are both seen, in order, with nobody between."""
    a, b, watcher = harness.connect(ttl=TTL), harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    tokens = []
    for locks, identity in ((a, "a"), (b, "b")):
        async with locks.election("e", identity=identity).leadership() as term:
            tokens.append(term.token)
    seen = [await asyncio.wait_for(anext(changes), scaled(5)) for _ in range(4)]
    assert seen == [asynclock.Leader("a", tokens[0], None), None, asynclock.Leader("b", tokens[1], None), None]
    await changes.aclose()  # type: ignore[attr-defined]


async def test_an_observer_that_falls_far_behind_reads_afresh(
    harness: EtcdHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch whose events nobody reads stops keeping them past a bound (so an observer
    left unread cannot grow): it is dropped, and the next look reads the line afresh."""
    monkeypatch.setattr(_watch, "MAX_EVENTS", 3)
    locks, watcher = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    changes = watcher.election("e").observe()
    assert await anext(changes) is None
    for identity in ("a", "b"):  # four events: more than the watch keeps
        async with locks.election("e", identity=identity).leadership():
            pass
    async with locks.election("e", identity="c").leadership() as term:
        seen = await asyncio.wait_for(anext(changes), scaled(5))
        assert seen == asynclock.Leader("c", term.token, None), "the terms it fell behind on are skipped"
    await changes.aclose()  # type: ignore[attr-defined]


async def test_etcdctl_leads_asynclock_waits_and_both_observers_see_each_leader(
    harness: EtcdHarness, etcd_server: EtcdServer
) -> None:
    """``etcdctl elect`` campaigns first: an asynclock candidate waits in line behind it,
    asynclock's observer and ``etcdctl elect -l`` see its proposal; once it resigns
    (SIGTERM), the asynclock candidate leads, with a larger token, and both observers see it."""
    locks, watcher = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    election = locks.election("shared-with-go", identity="py-1")
    changes = watcher.election("shared-with-go").observe()
    assert await anext(changes) is None
    go = await etcdctl_elect(etcd_server, election.key, "go-1")
    listener = await etcdctl_elect(etcd_server, "-l", election.key)
    try:
        key, proposal = await printed(go, 2)
        assert key.startswith(election.key + "/") and proposal == "go-1"
        theirs = await asyncio.wait_for(anext(changes), scaled(5))
        assert theirs is not None and theirs.identity == "go-1"
        assert await printed(listener, 2) == [key, "go-1"]
        taking = asyncio.create_task(_lead_and_resign(election))
        await _waiters(watcher.election("shared-with-go"), 1)
        assert not taking.done()
        assert await stopped(go) == 0
        token = await asyncio.wait_for(taking, scaled(10))
        assert theirs.token is not None and token is not None and token > theirs.token
        ours = await asyncio.wait_for(anext(changes), scaled(5))
        assert ours is not None and (ours.identity, ours.token) == ("py-1", token)
        (ours_key, ours_value) = await printed(listener, 2)
        assert ours_key == f"{election.key}/{backend(locks).lease_id:x}" and ours_value == "py-1"
    finally:
        await stopped(go)
        await stopped(listener)
        await changes.aclose()  # type: ignore[attr-defined]


async def test_asynclock_leads_and_etcdctl_elect_waits_until_the_resign(
    harness: EtcdHarness, etcd_server: EtcdServer
) -> None:
    locks = harness.connect(ttl=TTL)
    election = locks.election("shared-with-go", identity="py-1")
    async with election.leadership() as term:
        go = await etcdctl_elect(etcd_server, election.key, "go-2")
        elected = asyncio.create_task(printed(go, 2))
        try:
            await _waiters(election, 1)  # etcdctl's candidate in line behind ours
            await asyncio.sleep(scaled(0.3))
            assert not elected.done(), "etcdctl led while asynclock did"
            assert (await election.leader()) == asynclock.Leader("py-1", term.token, None)
        except BaseException:
            await stopped(go)
            raise
        await election.resign()  # (the body ends here, and the async with quietly)
    try:
        key, proposal = await elected
        assert key.startswith(election.key + "/") and proposal == "go-2"
        leader = await election.leader()
        assert leader is not None and leader.identity == "go-2"
        assert term.token is not None and leader.token is not None and leader.token > term.token
    finally:
        code = await stopped(go)
        assert go.stderr is not None
        assert code == 0, (await go.stderr.read()).decode()
    assert await election.leader() is None


async def _lead_and_resign(election: asynclock.Election) -> int | None:
    async with election.leadership() as term:
        await election.resign()
    return term.token


async def _waiters(election: asynclock.Election, count: int) -> None:
    async with asyncio.timeout(scaled(10)):
        while (await election.info()).waiters != count:
            await asyncio.sleep(0.01)


# -- the lease ---------------------------------------------------------------------------------


async def test_a_paused_server_cancels_the_body_before_etcd_could_expire_the_lease(etcd_fresh: EtcdServer) -> None:
    async with asynclock.connect(etcd_fresh.url, ttl=TTL, prefix="pause") as locks:
        loop = asyncio.get_running_loop()
        etcd = backend(locks)
        cancelled_at: list[float] = []
        paused_at = 0.0
        with pytest.raises(LockLost):
            async with locks.lock("p") as lease:
                await asyncio.sleep(TTL / 2)
                etcd_fresh.pause()
                paused_at = loop.time()
                try:
                    await asyncio.sleep(10 * TTL)
                finally:
                    cancelled_at.append(loop.time())
        # etcd renewed the lease when the last answered keep-alive arrived (after
        # it was sent), for the TTL it granted: the body's deadline came before that,
        # and the body ended by its deadline (give or take a loaded machine)
        assert lease.expires_at <= etcd.confirmed_at + etcd.granted
        assert cancelled_at[0] <= lease.expires_at + 0.05
        assert cancelled_at[0] - paused_at <= TTL + 0.1
        etcd_fresh.resume()


async def test_a_cancelled_acquire_leaves_no_key(harness: EtcdHarness) -> None:
    holder, waiter = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    lock = holder.lock("cancel")
    admin = await harness.admin()
    async with lock:
        task = asyncio.create_task(waiter.lock("cancel").acquire())
        async with asyncio.timeout(scaled(5)):
            while len(await admin.keys(lock.key + "/")) < 2:
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        keys = [kv.key.decode() for kv in await admin.keys(lock.key + "/")]
        assert keys == [f"{lock.key}/{backend(holder).lease_id:x}"]


async def test_a_holder_gone_between_the_waiters_check_and_its_watch_still_lets_the_waiter_in(
    harness: EtcdHarness,
) -> None:
    """A waiter reads what blocks it, then watches that key for its deletion,
    from the revision etcd confirms the watch at (so that etcd reports it at
    once). A deletion that lands between the read and the watch is not among
    the events the watch reports: the waiter must notice it by reading again,
    not wait for an event that never comes."""
    holder, waiter = harness.connect(ttl=scaled(3.0)), harness.connect(ttl=scaled(3.0))
    await holder.lock("gap").acquire()
    admin = await harness.admin()
    client = backend(waiter).client
    watch = client.watch
    deleted: list[bool] = []

    async def holder_gone_first(key: bytes, start_revision: int, timeout: float, range_end: bytes = b"") -> Any:
        if not deleted:  # the holder's key goes after the waiter's read, before its watch
            deleted.append(await admin.delete(key))
        return await watch(key, start_revision, timeout, range_end)

    client.watch = holder_gone_first  # type: ignore[method-assign]
    lease = await waiter.lock("gap").acquire(timeout=scaled(5))
    assert deleted == [True]
    assert lease.token is not None
    await lease.release()


async def test_a_create_sent_before_its_acquire_was_cancelled_leaves_no_key(etcd_fresh: EtcdServer) -> None:
    """An acquire cancelled while etcd has its create but has not answered (paused):
    the create may still be applied once etcd runs again, after the cancellation.
    Its key must not stay behind (it would block the lock for as long as the
    client's lease lives): the clean-up waits for the create's outcome, then deletes."""
    ttl = scaled(3.0)
    async with (
        asynclock.connect(etcd_fresh.url, ttl=ttl, prefix="late") as locks,
        asynclock.connect(etcd_fresh.url, ttl=ttl, prefix="late") as other,
    ):
        lock = locks.lock("late")
        admin = AdminClient(etcd_fresh.hostport)
        try:
            etcd_fresh.pause()
            sent = backend(locks).client.requests
            task = asyncio.create_task(lock.acquire())
            async with asyncio.timeout(scaled(5)):
                while backend(locks).client.requests == sent:  # the create is on its way
                    await asyncio.sleep(0.001)
            await asyncio.sleep(scaled(0.05))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            etcd_fresh.resume()
            theirs = await other.lock("late").acquire(timeout=scaled(10))
            # (etcd, resumed, may apply the late create after the other client's, which
            # then holds at once: the late key goes a moment later)
            async with asyncio.timeout(scaled(5)):
                while [kv.key.decode() for kv in await admin.keys(lock.key + "/")] != [
                    f"{lock.key}/{backend(other).lease_id:x}"
                ]:
                    await asyncio.sleep(0.01)
            await theirs.release()
        finally:
            etcd_fresh.resume()
            await admin.close()


async def test_a_release_finished_later_stops_once_the_lease_is_gone_and_passes_the_turn_on(
    etcd_fresh: EtcdServer,
) -> None:
    """The background deletion of a released key is moot once its lease is gone.

    etcd, paused, answers nothing: the release fails and its key's deletion is
    retried in the background, until the lease (unconfirmed for a lease time)
    is gone, with every key of it. Then the deletion ends while etcd is still
    paused, and the next task of the client gets its turn at the lock.
    """
    async with asynclock.connect(etcd_fresh.url, ttl=TTL, prefix="moot") as locks:
        etcd = backend(locks)
        lease = await locks.lock("m").acquire()
        old_lease = etcd.lease_id
        queue = etcd_queue(etcd)
        try:
            etcd_fresh.pause()
            with pytest.raises(BackendUnavailable):
                await asyncio.wait_for(etcd.release(LockRef("lock", "m"), insides.hold_of(lease)), scaled(5))
            assert len(queue.tasks) == 1  # the deletion goes on in the background
            await eventually(lambda: not queue.tasks, scaled(5), "the background deletion ended")
            assert etcd.lease_id != old_lease  # (gone: none yet, etcd being paused)
        finally:
            etcd_fresh.resume()
        await asyncio.wait_for(lease.wait_lost(), scaled(5))

        async def take() -> int | None:
            async with locks.lock("m") as again:  # its turn was passed on, or it would wait for ever
                return again.token

        assert await asyncio.wait_for(asyncio.create_task(take()), scaled(10)) is not None


async def test_a_lease_not_confirmed_within_the_lease_time_is_gone_and_a_new_one_serves(harness: EtcdHarness) -> None:
    """The watchdog's renewals are the lease's keep-alives while the client holds a
    lock. With the watchdog stopped, the lease's confirmation grows older than the
    lease time: the next acquire finds that lease gone, the hold under it is lost
    (by the backend, saying why), the stale lease is revoked with its keys, and the
    new hold is granted under a new lease, with that lease's confirmation (a grant
    proven by the dead lease's would be refused by the front)."""
    locks = harness.connect(ttl=TTL)
    loop = asyncio.get_running_loop()
    first_lock = locks.lock("first")
    first = await first_lock.acquire()
    old = backend(locks).lease_id
    await insides.stop_renewing(locks)
    await asyncio.sleep(max(0.0, first.expires_at - loop.time()) + scaled(0.05))
    second_lock = locks.lock("second")
    second = await second_lock.acquire(timeout=scaled(2))
    assert "etcd lease was lost" in (first.lost_reason or "")
    new = backend(locks).lease_id
    assert new not in (0, old)
    assert second.expires_at > loop.time() + TTL / 2
    admin = await harness.admin()
    (key,) = await admin.keys(second_lock.key + "/")
    assert key.key.decode() == f"{second_lock.key}/{new:x}" and key.lease == new
    async with asyncio.timeout(scaled(5)):
        while (await admin.client.time_to_live(old, 5.0)).ttl > 0 or await admin.keys(first_lock.key + "/"):
            await asyncio.sleep(0.01)


async def test_a_lock_with_a_shorter_ttl_than_the_client_is_granted_with_a_young_enough_confirmation(
    harness: EtcdHarness,
) -> None:
    """The lease is kept alive every third of the client's ttl while nothing is held,
    so its confirmation can be older than a shorter lock's whole lease time: such a
    grant is confirmed again first instead of being refused as arriving too late."""
    client_ttl = scaled(3.0)
    locks = harness.connect(ttl=client_ttl)
    lock = locks.lock("short", ttl=client_ttl / 6)
    loop = asyncio.get_running_loop()
    etcd = backend(locks)
    await locks.lock("warm-up").acquire()
    await locks.lock("warm-up").release()
    seen = etcd.confirmed_at
    async with asyncio.timeout(scaled(5)):
        while etcd.confirmed_at == seen:  # the next idle keep-alive: the one after it is a third of the ttl away
            await asyncio.sleep(0.005)
    await asyncio.sleep(client_ttl / 6 + scaled(0.1))
    assert loop.time() - etcd.confirmed_at > lock.ttl
    async with lock as lease:
        assert lease.expires_at > loop.time() + lock.ttl / 3


async def test_aclose_revokes_the_lease_and_with_it_every_key(harness: EtcdHarness) -> None:
    locks = harness.connect(ttl=scaled(10))
    await locks.lock("a").acquire()
    await locks.rw_lock("b").read.acquire()
    lease_id = backend(locks).lease_id
    await locks.aclose()
    admin = await harness.admin()
    assert await admin.keys(f"{harness.prefix}/") == []
    assert (await admin.client.time_to_live(lease_id, 5.0)).ttl <= 0


# -- clusters --------------------------------------------------------------------------------


async def test_leader_killed_while_locks_are_held_and_waited_for(etcd_cluster: EtcdCluster) -> None:
    """No overlap, and the clients go on through another member."""
    clients = [asynclock.connect(etcd_cluster.url, ttl=scaled(2.0), prefix="failover") for _ in range(3)]
    inside = 0
    overlaps = 0
    done: list[int] = []
    stop = asyncio.Event()

    async def worker(locks: asynclock.Locks) -> None:
        nonlocal inside, overlaps
        while not stop.is_set():
            try:
                async with locks.lock("work"):
                    inside += 1
                    overlaps += inside > 1
                    await asyncio.sleep(0.005)
                    inside -= 1
                    done.append(1)
            except (LockLost, BackendUnavailable):
                pass  # lost or not reachable in time: never a second holder

    try:
        tasks = [asyncio.create_task(worker(clients[i % 3])) for i in range(6)]
        await eventually(lambda: len(done) >= 20, scaled(10), "work before the kill")
        leader = await asyncio.to_thread(etcd_cluster.leader)
        await asyncio.to_thread(leader.kill)
        before = len(done)
        await eventually(lambda: len(done) >= before + 30, scaled(20), "work after the leader died")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), scaled(20))
        assert overlaps == 0
        for locks in clients:
            assert backend(locks).client.current != leader.hostport
    finally:
        stop.set()
        for locks in clients:
            await locks.aclose()


async def test_the_whole_cluster_down_cancels_bodies_before_the_lease_ttl(etcd_cluster: EtcdCluster) -> None:
    async with asynclock.connect(etcd_cluster.url, ttl=TTL, prefix="down") as locks:
        loop = asyncio.get_running_loop()
        etcd = backend(locks)
        ended: list[float] = []
        deadlines: list[float] = []

        async def hold(name: str) -> None:
            try:
                async with locks.lock(name) as lease:
                    try:
                        await asyncio.sleep(100)
                    finally:
                        ended.append(loop.time())
                        deadlines.append(lease.expires_at)
            except LockLost:
                pass

        tasks = [asyncio.create_task(hold(name)) for name in ("a", "b")]
        await eventually(lambda: len(insides.core(locks).keeper or ()) == 2, scaled(5), "both held")
        await asyncio.sleep(TTL / 2)
        for server in etcd_cluster.servers.values():
            server.kill()
        down_at = loop.time()
        await asyncio.wait_for(asyncio.gather(*tasks), scaled(5))
        assert len(ended) == 2
        # each body trusted its lease only until before the server's lease ends (from the last
        # keep-alive confirmed), and was cancelled by that deadline (give or take a loaded machine)
        assert max(deadlines) <= etcd.confirmed_at + etcd.granted
        assert all(end <= deadline + scaled(0.25) for end, deadline in zip(ended, deadlines, strict=True))
        assert max(ended) - down_at <= TTL + scaled(0.25)


# -- configuration --------------------------------------------------------------------------


async def test_connecting_to_a_closed_port_fails_within_connect_timeout() -> None:
    port = free_port()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}"):
        async with asynclock.connect(f"etcd://127.0.0.1:{port}", connect_timeout=0.5):
            pass
    assert loop.time() - start <= scaled(0.5) + 1.0


@pytest.fixture
def etcd_auth() -> Iterator[EtcdServer]:
    """An etcd with authentication on: user root, password ``s3cret``."""
    server = EtcdServer()
    server.start()
    try:
        server.etcdctl("user", "add", "root:s3cret")
        server.etcdctl("auth", "enable")
        yield server
    finally:
        server.cleanup()


async def test_a_client_made_after_the_server_came_back_connects_at_once(etcd_fresh: EtcdServer) -> None:
    """Another client's back-off is not a new client's: while one client of
    this process rides out a server that is down, a new client made once the
    server is back connects (gRPC would otherwise hand it the older client's
    connection to the same address, still waiting out its back-off, and it
    would be refused at once although the server answers)."""
    async with asynclock.connect(etcd_fresh.url, ttl=TTL) as riding_out:
        await riding_out.lock("kept").acquire(detached=True)
        etcd_fresh.kill()
        await asyncio.sleep(scaled(1))  # its connection is in back-off now
        with pytest.raises(BackendUnavailable, match="refused"):
            async with asynclock.connect(etcd_fresh.url, ttl=TTL, connect_timeout=scaled(2)):
                pass
        etcd_fresh.start()
        async with asynclock.connect(etcd_fresh.url, ttl=TTL, connect_timeout=scaled(5)) as locks:
            async with locks.lock("back") as lease:
                assert lease.token is not None
        async with riding_out.lock("back").acquire(timeout=scaled(10)):
            pass  # and the older client is back too


async def test_refused_credentials_raise_configuration_error(etcd_auth: EtcdServer) -> None:
    for url in (etcd_auth.url, f"etcd://root:wrong@{etcd_auth.hostport}"):
        with pytest.raises(ConfigurationError) as caught:
            async with asynclock.connect(url, ttl=TTL):
                pass
        assert "wrong" not in str(caught.value)
        assert etcd_auth.hostport in str(caught.value)
    async with asynclock.connect(f"etcd://root:s3cret@{etcd_auth.hostport}", ttl=TTL) as locks:
        async with locks.lock("with-auth") as lease:
            assert lease.token is not None
    out = etcdctl(etcd_auth.endpoint, "--user=root:s3cret", "get", "--prefix", "asynclock/", "--keys-only")
    assert out.strip() == ""


@pytest.fixture
def etcd_tls(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd that serves clients over TLS only, with a certificate of a test CA."""
    server = EtcdServer(tls=TlsFiles(tmp_path / "tls"))
    server.start()
    yield server
    server.cleanup()


async def test_etcds_connects_with_the_ca_file_and_refuses_an_unknown_certificate(etcd_tls: EtcdServer) -> None:
    assert etcd_tls.tls is not None
    url = f"{etcd_tls.url}?ca_file={etcd_tls.tls.ca}"
    async with asynclock.connect(url, ttl=TTL) as locks:
        async with locks.lock("over-tls") as lease:
            assert lease.token is not None
    # the system's roots do not know the test CA: no retry can fix that
    with pytest.raises(ConfigurationError, match="TLS"):
        async with asynclock.connect(etcd_tls.url, ttl=TTL, connect_timeout=2):
            pass
    with pytest.raises(ConfigurationError, match="cannot read"):
        async with asynclock.connect(f"{etcd_tls.url}?ca_file={etcd_tls.tls.ca}.missing", ttl=TTL):
            pass


def test_etcdctl_is_installed() -> None:
    """The interop tests need etcdctl; tests/run.sh installs it."""
    assert etcdctl_binary() is not None
    assert (
        "etcdctl version"
        in subprocess.run([etcdctl_binary() or "etcdctl", "version"], capture_output=True, text=True, check=True).stdout
    )


async def test_inspect_lists_and_describes_holders_and_waiters(harness: EtcdHarness, etcd_server: EtcdServer) -> None:
    """What ``asynclock inspect etcd://…`` shows: asynclock's and etcdctl's holders, waiters, tokens."""
    from asynclock._inspect import collect

    holder, waiter = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    lock = holder.lock("seen/by inspect")
    async with lock as lease:

        async def wait_in_line() -> None:
            async with waiter.lock("seen/by inspect"):
                pass

        queued = asyncio.create_task(wait_in_line())
        await eventually(lambda: bool(insides.queued(waiter)), scaled(5), "the waiter queued")
        async with asyncio.timeout(scaled(5)):
            while (await lock.info()).waiters != 1:
                await asyncio.sleep(0.01)
        infos = await collect(harness.url, [], prefix=harness.prefix)
        assert [info.name for info in infos] == ["seen/by inspect"]
        (info,) = infos
        assert info.key == lock.key and info.token == lease.token and info.waiters == 1
        assert info.owner == f"{lock.key}/{backend(holder).lease_id:x}"  # seen from another client: the key
        assert info.ttl is not None and 0 <= info.ttl <= TTL + 1
    await asyncio.wait_for(queued, scaled(5))
