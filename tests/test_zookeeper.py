"""ZooKeeper-only behaviour, against real ZooKeeper servers (Debian's package).

The recipe (Curator-style nodes, numeric order, predecessor watches, recovery
of a create whose answer was lost), name escaping, the session as the lease
(server paused, connection cut: the holder is cancelled before anyone else
gets the lock), the aiozk behaviours we work around, interop with kazoo and
Curator on one path, and a three-server ensemble losing its leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import re
import shutil
import struct
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from aiozk import protocol
from hypothesis import given, settings
from hypothesis import strategies as st

import asynclock
from asynclock import BackendUnavailable, LockLost, LockTimeout
from asynclock.abc import LockRef
from asynclock.backends.zookeeper import ZooKeeperBackend, escape_name, parse_url
from asynclock.backends.zookeeper._connection import Frames
from asynclock.backends.zookeeper._nodes import Node
from asynclock.backends.zookeeper._order import contenders_of
from asynclock.backends.zookeeper._wire import (
    EPHEMERAL,
    SEQUENTIAL,
    ZStat,
    _parse_children,
    _parse_created,
    _parse_exists,
    children_request,
    create_request,
    delete_request,
    exists_request,
)
from tests.harnesses import eventually, insides
from tests.harnesses.zookeeper import ZooKeeperHarness, connect_next_to, connected_host, hold_node, spy_sends, zk_nodes
from tests.servers import scaled
from tests.servers.proxy import TcpProxy
from tests.servers.zookeeper import ZooKeeperEnsemble, ZooKeeperServer, four_letter

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


@pytest.fixture
async def zk(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zookeeper_server)
    async with harness:
        yield harness


@pytest.fixture
def zk_fresh() -> Iterator[ZooKeeperServer]:
    """A standalone server of its own, for tests that pause, kill or restart it."""
    server = ZooKeeperServer()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", zookeeper_server.port) as tcp:
        yield tcp


async def _take(lock: asynclock.Lock) -> tuple[int | None, bool]:
    """Acquire and release in one task (the owner); the token and whether it was lost inside."""
    async with lock as lease:
        return lease.token, lease.lost
    raise AssertionError("unreachable: the block returns or raises")


def backend_of(locks: asynclock.Locks) -> ZooKeeperBackend:
    backend = locks.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


# -- names ---------------------------------------------------------------------------


def _valid_znode_name(name: str) -> bool:
    """ZooKeeper's own check (PathUtils.validatePath), on the name's UTF-16 code units."""
    if not name or name in (".", "..") or "/" in name:
        return False
    raw = name.encode("utf-16-le")
    units = struct.unpack(f"<{len(raw) // 2}H", raw)
    return not any(u <= 0x1F or 0x7F <= u <= 0x9F or 0xD800 <= u <= 0xF8FF or u >= 0xFFF0 for u in units)


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_escaping_is_injective_and_gives_valid_znode_names(a: str, b: str) -> None:
    for name in (a, b):
        escaped = escape_name(name)
        assert unquote(escaped, errors="strict") == name
        assert _valid_znode_name(escaped), escaped
    if a != b:
        assert escape_name(a) != escape_name(b)


def test_escaping_of_the_names_zookeeper_would_alias_or_reject() -> None:
    names = ["a/b", "a//b", "a/b/", "/", "..", ".", "a%2Fb", "%", "a\x00b", "\x7f", "\x85", "\ue000", "\ufff0", "🔒"]
    escaped = [escape_name(name) for name in names]
    assert len(set(escaped)) == len(names)
    assert escape_name("a/b") == "a%2Fb" and escape_name("a%2Fb") == "a%252Fb"
    assert escape_name("..") == "%2E%2E" and escape_name(".x") == ".x"
    assert all(_valid_znode_name(e) for e in escaped)


def test_url_parsing() -> None:
    hosts, chroot, options = parse_url("zk://h1:1,h2:2,h3/app/locks?session_timeout=5")
    assert hosts == [("h1", 1), ("h2", 2), ("h3", 2181)]
    assert chroot == "/app/locks" and options == {"session_timeout": "5"}
    with pytest.raises(ValueError):
        parse_url("zk://h1:1/a/../b")
    with pytest.raises(ValueError):
        asynclock.connect("zk://127.0.0.1:1?session_timeout=0")
    with pytest.raises(ValueError):
        asynclock.connect("zk://127.0.0.1:1?bogus=1")
    backend = backend_of(asynclock.connect("zk://127.0.0.1:1/root?session_timeout=7", ttl=3, prefix="p/q"))
    assert backend.session.requested_timeout == 7
    assert backend.lock_key(LockRef("lock", "a/b")) == "/root/p%2Fq/a%2Fb"
    assert backend_of(asynclock.connect("zk://127.0.0.1:1", ttl=3)).session.requested_timeout == 3


async def test_odd_names_are_distinct_nodes_on_the_server(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    names = ["a/b", "a//b", "a/b/", "..", ".", "a\x00b", "\x01", "\ue000", "\ufff5", "🔒", "a%2Fb", "ключ"]
    for name in names:
        await locks.lock(name).acquire(timeout=0)
    admin = await zk.admin()
    dirs = await admin.children(zk.base)
    assert sorted(unquote(d) for d in dirs) == sorted(names)
    for name in names:
        assert len(await admin.contenders(locks.lock(name).key)) == 1
        await locks.lock(name).release()


# -- the recipe --------------------------------------------------------------------------


async def test_node_is_named_like_curator_protected_mode_and_token_is_czxid(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    lock = locks.lock("shape")
    lease = await lock.acquire()
    admin = await zk.admin()
    [holder] = await admin.contenders(lock.key)
    assert re.fullmatch(r"_c_[0-9a-f-]{36}-lock-\d{10}", holder.rsplit("/", 1)[1])
    stat = await admin.stat(holder)
    assert stat is not None and lease.token == stat.created_zxid
    assert stat.ephemeral_owner == backend_of(locks).session.session_id
    info = await lock.info()
    assert info.key == lock.key and info.owner is not None and info.owner.startswith(locks.client_id)
    assert info.ttl == backend_of(locks).session.timeout and info.waiters == 0
    await lock.release()
    # the token keeps growing even when the lock's znode is deleted and made again
    await admin.delete_tree(lock.key)
    again = await lock.acquire()
    assert again.token is not None and lease.token is not None and again.token > lease.token
    await lock.release()


async def test_reentry_writes_nothing(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    lock = locks.lock("re")
    async with lock:
        admin = await zk.admin()
        [holder] = await admin.contenders(lock.key)
        before = await admin.stat(holder)
        async with lock as inner:
            assert inner.hold_count == 2
            assert (await lock.info()).hold_count == 2
        after = await admin.stat(holder)
        assert before is not None and after is not None
        assert (before.last_modified_zxid, before.version) == (after.last_modified_zxid, after.version)


async def test_foreign_contenders_count_by_sequence_number(zk: ZooKeeperHarness) -> None:
    """A kazoo-named node with a lower sequence number holds; ours waits for it."""
    locks = zk.connect(ttl=TTL)
    lock = locks.lock("foreign")
    admin = await zk.admin()
    await locks.__aenter__()
    await zk_nodes(backend_of(locks)).ensure_parents(lock.key)
    reply = await admin.session.call(
        protocol.Create2Request(
            path=f"{lock.key}/{uuid.uuid4().hex}__lock__",
            data=b"",
            acl=[protocol.UNRESTRICTED_ACCESS],
            flags=EPHEMERAL | SEQUENTIAL,
        )
    )
    foreign = str(reply.path)
    # unrelated children (no 10-digit suffix) are no contenders
    await admin.session.call(
        protocol.Create2Request(
            path=f"{lock.key}/readme", data=b"", acl=[protocol.UNRESTRICTED_ACCESS], flags=EPHEMERAL
        )
    )
    with pytest.raises(LockTimeout):
        await lock.acquire(timeout=0)
    info = await lock.info()
    assert info.owner == foreign.rsplit("/", 1)[1] and info.token == reply.stat.created_zxid

    async def take() -> int | None:
        async with lock as lease:
            return lease.token
        raise AssertionError("unreachable: the block returns or raises")

    task = asyncio.create_task(take())
    await asyncio.sleep(0.1)
    assert not task.done()
    assert (await lock.info()).waiters == 1
    await admin.delete(foreign)
    token = await asyncio.wait_for(task, scaled(5))
    assert token is not None and token > reply.stat.created_zxid
    await admin.delete(f"{lock.key}/readme")


@pytest.mark.parametrize("path", ["/a", "/asynclock/p/_c_3f8a-lock-", "/é/日本/%2F", "/x" * 300])
def test_hand_serialised_requests_and_replies_match_aiozk(path: str) -> None:
    acl = [protocol.UNRESTRICTED_ACCESS]
    pairs = [
        (create_request(path, EPHEMERAL | SEQUENTIAL), protocol.Create2Request(path=path, data=b"", acl=acl, flags=3)),
        (create_request(path, 0), protocol.Create2Request(path=path, data=b"", acl=acl, flags=0)),
        (children_request(path), protocol.GetChildrenRequest(path=path, watch=False)),
        (children_request(path, watch=True), protocol.GetChildrenRequest(path=path, watch=True)),
        (delete_request(path), protocol.DeleteRequest(path=path, version=-1)),
        (delete_request(path, 7), protocol.DeleteRequest(path=path, version=7)),
        (exists_request(path), protocol.ExistsRequest(path=path, watch=False)),
        (exists_request(path, watch=True), protocol.ExistsRequest(path=path, watch=True)),
    ]
    for ours, theirs in pairs:
        assert ours.opcode == theirs.opcode
        assert ours.serialize(12345) == theirs.serialize(12345), type(theirs).__name__
    container = create_request(path, 4, container=True)
    assert container.opcode == 19 and container.body == create_request(path, 4).body
    stat = struct.pack("!qqqqiiiqiiq", 2**40 + 1, 2, 3, 4, 5, 6, 7, 0x1234, 9, 10, 11)
    created = struct.pack("!i", len(path.encode())) + path.encode() + stat
    mine = _parse_created(created)
    aiozk_reply = protocol.Create2Response.deserialize(created)
    assert mine.path == aiozk_reply.path
    for field in ZStat._fields:
        assert getattr(mine.stat, field) == getattr(aiozk_reply.stat, field), field
    assert _parse_exists(stat).stat == mine.stat
    names = [path.strip("/")[:50], "b", ""]
    listing = struct.pack("!i", len(names)) + b"".join(struct.pack("!i", len(n.encode())) + n.encode() for n in names)
    assert _parse_children(listing).children == list(protocol.GetChildrenResponse.deserialize(listing).children)
    assert _parse_children(struct.pack("!i", -1)).children == []
    with pytest.raises(ValueError):
        _parse_created(struct.pack("!i", 500) + b"short")


def test_contenders_sort_numerically_not_by_name() -> None:
    children = ["b__lock__0000000010", "_c_x-lock-0000000002", "readme", "a-lock-0000000011", "c__lock__0000000001"]
    assert contenders_of(children) == [
        "c__lock__0000000001",
        "_c_x-lock-0000000002",
        "b__lock__0000000010",
        "a-lock-0000000011",
    ]


async def test_each_waiter_watches_only_its_predecessor(zk: ZooKeeperHarness) -> None:
    clients = [zk.connect(ttl=scaled(2)) for _ in range(4)]
    holder = await clients[0].lock("herd").acquire()
    waiters = [asyncio.create_task(c.lock("herd").acquire()) for c in clients[1:]]
    admin = await zk.admin()
    key = clients[0].lock("herd").key

    async def queued() -> list[str]:
        return await admin.contenders(key)

    for _ in range(200):
        if len(await queued()) == 4:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    nodes = await queued()
    assert len(nodes) == 4
    owners = {}
    for path in nodes:
        stat = await admin.stat(path)
        assert stat is not None
        owners[path] = stat.ephemeral_owner
    watched = _watchers_by_path(zk.server.port)
    for index, path in enumerate(nodes):
        others = {sid for sid in watched.get(path, set()) if sid != owners[path]}
        expected = {owners[nodes[index + 1]]} if index + 1 < len(nodes) else set()
        assert others == expected, (index, watched)
    assert holder.token is not None
    await clients[0].lock("herd").release()
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_the_connection_reader_handles_each_frame_as_its_last_byte_arrives() -> None:
    """Reply frames cut anywhere (as TCP may deliver them) reach the session whole and in
    order, each within the call that delivered its last byte (no reader task, no loop turn
    in between); a frame length no server sends, or a frame the session cannot handle,
    ends the connection with the reason, and nothing after it is handled."""
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _r, w: accepted.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    opened: list[asyncio.StreamWriter] = []

    async def reader_of(on_frame: Callable[[bytes], None]) -> Frames:
        stream, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append(writer)
        return Frames.attach(stream, writer, "test", on_frame)

    try:
        frames = [bytes(16) + b"a", bytes(range(200)) * 3, bytes(16)]
        wire = b"".join(struct.pack("!i", len(frame)) + frame for frame in frames)
        ends = [sum(4 + len(frame) for frame in frames[: i + 1]) for i in range(len(frames))]
        for cut in (1, 3, 7, 64, len(wire)):
            got: list[bytes] = []
            reader = await reader_of(got.append)
            for start in range(0, len(wire), cut):
                reader.data_received(wire[start : start + cut])
                assert got == frames[: sum(end <= start + cut for end in ends)], (cut, start)
            assert not reader.ended.done()

        got = []
        reader = await reader_of(got.append)
        reader.data_received(struct.pack("!i", 3) + b"xyz" + wire)
        assert reader.ended.result() == "bad frame length 3 from test" and got == []

        def refuse(frame: bytes) -> None:
            got.append(frame)
            raise ValueError("garbled")

        reader = await reader_of(refuse)
        reader.data_received(wire)
        assert reader.ended.result() == "bad reply: garbled" and got == frames[:1]  # (the reason in words)
    finally:
        for writer in opened + accepted:
            writer.close()
        for writer in opened:  # the stream's own protocol is told of the close
            await asyncio.wait_for(writer.wait_closed(), 5)
        server.close()
        await server.wait_closed()


async def test_a_free_lock_costs_create_pipelined_children_and_delete(zk: ZooKeeperHarness) -> None:
    """Three requests in two round trips; the held node's watch rides on the first renewal."""
    ttl = scaled(1.2)
    locks = zk.connect(ttl=ttl)
    lock = locks.lock("cheap")
    async with lock:
        pass  # connects and makes the lock's parents
    session = backend_of(locks).session
    names = {15: "create2", 8: "getChildren", 3: "exists", 4: "getData", 2: "delete"}
    sent: list[tuple[str, bool]] = []

    def record(conn: Any, request: Any, path: str) -> None:
        sent.append((names.get(int(request.opcode), str(request.opcode)), bool(conn.pending)))

    spy_sends(session, record)
    lease = await lock.acquire()
    # the children were asked for before the create was answered
    assert sent == [("create2", False), ("getChildren", True)]
    key = lock.key
    [holder] = await (await zk.admin()).contenders(key)
    sid = backend_of(locks).session.session_id
    assert sid not in _watchers_by_path(zk.server.port).get(holder, set())
    # the first renewal sets the deletion watch, in its exists request
    await eventually(lambda: any(name == "exists" for name, _ in sent), scaled(5), "a renewal")
    watched = _watchers_by_path(zk.server.port).get(holder, set())
    assert sid in watched
    assert not [name for name, _ in sent if name == "getData"]
    # and deleting the node now loses the lease through that watch, not a later renewal
    assert await zk.expire("cheap")
    reason = await asyncio.wait_for(lease.wait_lost(), scaled(5))
    assert "lock node was deleted" in reason, reason
    assert not lock.held


async def test_the_next_in_line_takes_over_on_the_deletion_event_without_reading_again(zk: ZooKeeperHarness) -> None:
    holder, waiter, third = (zk.connect(ttl=scaled(2)) for _ in range(3))
    await holder.lock("next").acquire()
    waiting = asyncio.create_task(_take(waiter.lock("next")))
    key = holder.lock("next").key
    admin = await zk.admin()
    for _ in range(500):
        if len(await admin.contenders(key)) == 2:
            break
        await asyncio.sleep(0.01)
    last = asyncio.create_task(_take(third.lock("next")))
    for _ in range(500):
        if len(await admin.contenders(key)) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # both have read the queue and set their watch
    sent: list[tuple[str, int]] = []
    for who, client in (("waiter", waiter), ("third", third)):

        def record(conn: Any, request: Any, path: str, who: str = who) -> None:
            sent.append((who, int(request.opcode)))

        spy_sends(backend_of(client).session, record)
    await holder.lock("next").release()
    token, lost = await asyncio.wait_for(waiting, scaled(5))
    assert token is not None and not lost
    # the waiter read no children (8) between the holder's release and its own delete (2)
    ops = [op for who, op in sent if who == "waiter"]
    assert 2 in ops and 8 not in ops[: ops.index(2)], sent
    await asyncio.wait_for(last, scaled(5))


def _watchers_by_path(port: int) -> dict[str, set[int]]:
    text = four_letter(port, b"wchp").decode()
    found: dict[str, set[int]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("/"):
            current = line.strip()
            found[current] = set()
        elif line.strip().startswith("0x") and current is not None:
            found[current].add(int(line.strip(), 16))
    return found


async def test_a_create_whose_answer_was_lost_is_found_by_its_guid(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    await locks.__aenter__()
    backend = backend_of(locks)
    session = backend.session
    admin = await zk.admin()
    key = backend.lock_key(LockRef("lock", "lost-create"))
    await zk_nodes(backend).ensure_parents(key)
    # the create went through, its answer never came: one node, ours
    node = Node("lost-create", "h-1", key, str(uuid.uuid4()))
    reply = await session.call(
        protocol.Create2Request(
            path=f"{key}/_c_{node.guid}-lock-",
            data=b"",
            acl=[protocol.UNRESTRICTED_ACCESS],
            flags=EPHEMERAL | SEQUENTIAL,
        )
    )
    node.uncertain, node.session = True, session.session_id
    await zk_nodes(backend).create(node, None)
    assert node.path == reply.path and node.czxid == reply.stat.created_zxid
    assert await admin.contenders(key) == [reply.path]
    # a node with our GUID owned by another session is not adopted (and is removed)
    other = Node("lost-create", "h-2", key, str(uuid.uuid4()))
    stray = await admin.session.call(
        protocol.Create2Request(
            path=f"{key}/_c_{other.guid}-lock-",
            data=b"",
            acl=[protocol.UNRESTRICTED_ACCESS],
            flags=EPHEMERAL | SEQUENTIAL,
        )
    )
    other.uncertain, other.session = True, session.session_id
    await zk_nodes(backend).create(other, None)
    assert other.path != stray.path
    assert await admin.contenders(key) == [reply.path, other.path]
    await admin.delete(str(reply.path))
    assert other.path is not None
    await admin.delete(other.path)


async def test_a_connection_cut_while_the_create_is_in_flight_leaves_one_node(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    """The create reaches the server, its answer is lost with the connection: no second node."""
    locks = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(3), prefix=zk.prefix)
    async with locks:
        lock = locks.lock("cut-create")
        await lock.info()  # connected, parents not made yet
        session = backend_of(locks).session
        admin = await zk.admin()

        async def hold() -> tuple[int | None, list[str]]:
            async with lock as lease:
                return lease.token, await admin.contenders(lock.key)
            raise AssertionError("unreachable: the block returns or raises")

        proxy.delay(0.3)
        task = asyncio.create_task(hold())
        for _ in range(200):  # until the create has been applied, its answer still on the way
            if await admin.contenders(lock.key):
                break
            await asyncio.sleep(0.01)
        proxy.reset()
        proxy.heal()
        token, nodes = await asyncio.wait_for(task, scaled(10))
        assert session.reconnects >= 1
        assert len(nodes) == 1, nodes
        stat = await admin.stat(nodes[0])
        assert stat is None  # released since
        assert token is not None
    assert await admin.contenders(lock.key) == []


async def test_an_acquire_cancelled_while_its_create_is_on_the_wire_leaves_no_node(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    """The server applies the create after the caller was cancelled: release by identity finds it by its GUID."""
    locks = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(3), prefix=zk.prefix)
    other = zk.connect(ttl=scaled(3))
    async with locks:
        lock = locks.lock("cancel-create")
        await lock.info()  # connected
        await zk_nodes(backend_of(locks)).ensure_parents(lock.key)
        admin = await zk.admin()
        proxy.delay(0.3)  # every answer comes late: the create lands, its answer is on the way
        task = asyncio.create_task(lock.acquire())
        for _ in range(200):
            if await admin.contenders(lock.key):
                break
            await asyncio.sleep(0.01)
        [node] = await admin.contenders(lock.key)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, scaled(5))
        proxy.heal()
        for _ in range(500):
            if not await admin.contenders(lock.key):
                break
            await asyncio.sleep(0.01)
        assert await admin.contenders(lock.key) == [], node
        assert not lock.held
        lease = await other.lock("cancel-create").acquire(timeout=0)  # free, with nobody queued ahead
        await other.lock("cancel-create").release()
        assert lease.token is not None


async def test_a_queued_wait_runs_in_the_callers_task(zk: ZooKeeperHarness) -> None:
    """Waiting in the queue starts no task: the wait (watching the predecessor) is the caller's own."""
    holder, waiter = zk.connect(ttl=scaled(6)), zk.connect(ttl=scaled(6))
    async with holder, waiter:
        async with waiter.lock("warm-up"):
            pass  # the waiter's client, session and watchdog are up
        await holder.lock("own-task").acquire()
        key = holder.lock("own-task").key
        admin = await zk.admin()
        before = asyncio.all_tasks()
        task = asyncio.create_task(_take(waiter.lock("own-task")))
        for _ in range(300):
            if len(await admin.contenders(key)) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(await admin.contenders(key)) == 2
        started = {t for t in asyncio.all_tasks() - before if not t.done()} - {task, asyncio.current_task()}
        assert started == set(), [t.get_coro() for t in started]
        await holder.lock("own-task").release()
        token, lost = await asyncio.wait_for(task, scaled(5))
        assert token is not None and not lost


async def test_waiter_rereads_after_reconnect_when_the_release_was_missed(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    holder = zk.connect(ttl=scaled(3))
    waiter = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(3), prefix=zk.prefix)
    async with waiter:
        await holder.lock("rr").acquire()
        task = asyncio.create_task(_take(waiter.lock("rr")))
        admin = await zk.admin()
        key = holder.lock("rr").key
        for _ in range(300):
            if len(await admin.contenders(key)) == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        session = backend_of(waiter).session
        sid, reconnects = session.session_id, session.reconnects
        proxy.refuse(True)
        proxy.reset()
        await holder.lock("rr").release()  # the watch event goes nowhere
        await asyncio.sleep(0.1)
        proxy.refuse(False)
        token, lost = await asyncio.wait_for(task, scaled(5))
        assert session.session_id == sid and session.reconnects > reconnects
        assert token is not None and not lost


# -- the lease is the session ---------------------------------------------------------------


async def test_session_timeout_is_negotiated_and_the_lease_is_shorter(zookeeper_server: ZooKeeperServer) -> None:
    url = zookeeper_server.url
    async with asynclock.connect(f"{url}?session_timeout=0.05") as short:
        backend = backend_of(short)
        assert short.ttl == 0.05  # (the ttl follows the session timeout asked for)
        assert backend.session.timeout == pytest.approx(2 * zookeeper_server.tick_ms / 1000)  # clamped up
        assert backend.lease_time(1) < backend.session.timeout
    async with asynclock.connect(url, ttl=100) as long:
        backend = backend_of(long)
        assert backend.session.timeout == 60  # the server's maxSessionTimeout
        assert backend.lease_time(100) < 60


async def test_a_lock_ttl_the_session_cannot_carry_is_refused(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=scaled(1))
    with pytest.raises(ValueError, match="session"):
        await locks.lock("long-ttl", ttl=scaled(10)).acquire()
    async with locks.lock("short-ttl", ttl=scaled(0.5)) as lease:
        await asyncio.sleep(scaled(1.5))  # renewed every ttl/3, and the session with it
        assert not lease.lost


async def _holder_and_successor(
    holder: asynclock.Locks, successor: asynclock.Locks, fault: Any, heal: Any, outage: float, *, heal_first: bool
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    seen: dict[str, Any] = {}
    entered = asyncio.Event()

    async def hold() -> None:
        try:
            async with holder.lock("lease"):
                entered.set()
                try:
                    await asyncio.sleep(1000)
                finally:
                    seen["cancelled"] = loop.time()
        except LockLost as exc:
            seen["lost"] = exc.reason

    async def succeed() -> None:
        async with successor.lock("lease") as lease:
            seen["acquired"] = loop.time()
            seen["token"] = lease.token

    first = asyncio.create_task(hold())
    await asyncio.wait_for(entered.wait(), scaled(5))
    second = asyncio.create_task(succeed())
    await asyncio.sleep(0.1)
    fault()
    try:
        if heal_first:  # the successor needs the server back (it is the paused one)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(first), outage)
            heal()
        await asyncio.wait_for(asyncio.gather(first, second), scaled(20))
    finally:
        heal()
    return seen


async def test_paused_server_the_holder_is_cancelled_before_the_successor_acquires(
    zk_fresh: ZooKeeperServer,
) -> None:
    session_timeout = scaled(1.0)
    holder = asynclock.connect(zk_fresh.url, ttl=session_timeout, prefix="pause")
    successor = asynclock.connect(zk_fresh.url, ttl=scaled(6), prefix="pause")
    async with holder, successor:
        seen = await _holder_and_successor(
            holder, successor, zk_fresh.pause, zk_fresh.resume, outage=session_timeout * 2, heal_first=True
        )
    assert "lost" in seen, seen
    assert seen["cancelled"] < seen["acquired"]


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
async def test_cut_connection_the_holder_is_cancelled_before_the_successor_acquires(
    zk: ZooKeeperHarness, proxy: TcpProxy, cut: str
) -> None:
    session_timeout = scaled(1.0)
    holder = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=session_timeout, prefix=zk.prefix)
    successor = zk.connect(ttl=scaled(3))

    def fault() -> None:
        if cut == "blackhole":
            proxy.blackhole()
        else:
            proxy.refuse(True)
            proxy.reset()

    async with holder:
        session = backend_of(holder).session
        old_session = session.session_id
        # healed only after the successor got it: the server expired the holder's session
        seen = await _holder_and_successor(holder, successor, fault, proxy.heal, outage=scaled(20), heal_first=False)
        # the session expired on the server: the client learns it when it reconnects
        await eventually(lambda: session.connected, scaled(10), "reconnect with a new session")
        assert session.session_id != old_session
    assert "lost" in seen, seen
    assert seen["cancelled"] < seen["acquired"]


async def test_a_cut_shorter_than_the_session_loses_nothing(zk: ZooKeeperHarness, proxy: TcpProxy) -> None:
    """Connections closed before the ConnectResponse are not an expiry: the session goes on.
    Meanwhile the lease is at risk (its holder may checkpoint), and no longer once renewed."""
    events: list[asynclock.LockEvent] = []
    locks = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(4), prefix=zk.prefix, on_event=events.append)
    async with locks:
        lock = locks.lock("short-cut")
        lease = await lock.acquire()
        session = backend_of(locks).session
        sid = session.session_id
        proxy.refuse(True)  # every reconnect attempt is closed at once
        proxy.reset()
        await eventually(lambda: not session.connected, scaled(2), "disconnect noticed")
        assert "connection was lost" in await asyncio.wait_for(lease.wait_at_risk(), scaled(1))
        await asyncio.sleep(scaled(0.5))
        proxy.refuse(False)
        await eventually(lambda: session.connected, scaled(3), "reconnected")
        assert session.session_id == sid
        await asyncio.sleep(scaled(1.5))  # renewals go on
        assert not lease.lost and lock.held and not lease.at_risk
        assert [event.kind for event in events if event.kind in ("at_risk", "lost")] == ["at_risk"]
        await lock.release()


# -- aiozk behaviours worked around ----------------------------------------------------------


async def test_a_killed_server_is_noticed_at_once_and_errors_are_ours(zk_fresh: ZooKeeperServer) -> None:
    locks = asynclock.connect(zk_fresh.url, ttl=scaled(4), prefix="kill")
    async with locks:
        session = backend_of(locks).session
        await locks.lock("k").acquire()
        zk_fresh.kill()
        # EOF is noticed at once: an unanswered ping would take 2/3 of the 4 s session timeout
        await eventually(lambda: not session.connected, scaled(1), "EOF noticed")
        with pytest.raises(BackendUnavailable) as caught:
            await locks.lock("other").info()
        assert not type(caught.value).__module__.startswith("aiozk")
        with pytest.raises(BackendUnavailable):
            await locks.lock("other").acquire(timeout=0.2)


async def test_restarted_server_keeps_the_session_and_the_lock(zk_fresh: ZooKeeperServer) -> None:
    """Reconnecting is prompt (no 4 s/8 s backoff) and the session survives the restart."""
    locks = asynclock.connect(zk_fresh.url, ttl=scaled(8), prefix="restart")
    async with locks:
        session = backend_of(locks).session
        lock = locks.lock("r")
        lease = await lock.acquire()
        sid = session.session_id
        zk_fresh.kill()
        await eventually(lambda: not session.connected, scaled(2), "EOF noticed")
        await asyncio.to_thread(zk_fresh.start)
        await eventually(lambda: session.connected, scaled(3), "prompt reconnect")
        assert session.session_id == sid
        assert not lease.lost
        await lock.release()


async def test_close_is_bounded_when_the_server_is_paused(zk_fresh: ZooKeeperServer) -> None:
    """Closing the session does not wait for a paused server (aiozk waited a session timeout)."""
    idle = asynclock.connect(zk_fresh.url, ttl=scaled(20), prefix="close")
    holding = asynclock.connect(zk_fresh.url, ttl=scaled(20), prefix="close")
    await idle.__aenter__()
    await holding.__aenter__()
    await holding.lock("c").acquire()
    zk_fresh.pause()
    try:
        await asyncio.wait_for(idle.aclose(), scaled(3))
        await asyncio.wait_for(backend_of(holding).aclose(), scaled(3))
    finally:
        zk_fresh.resume()
    await holding.aclose()


async def test_cancelled_waiter_deletes_its_node_even_while_disconnected(zk: ZooKeeperHarness, proxy: TcpProxy) -> None:
    holder = zk.connect(ttl=scaled(2))
    waiter = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(2), prefix=zk.prefix)
    async with waiter:
        await holder.lock("cd").acquire()
        task = asyncio.create_task(waiter.lock("cd").acquire())
        admin = await zk.admin()
        key = holder.lock("cd").key
        for _ in range(300):
            if len(await admin.contenders(key)) == 2:
                break
            await asyncio.sleep(0.01)
        proxy.blackhole()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, scaled(5))  # bounded though the server is unreachable
        proxy.heal()
        # the background clean-up deletes the node once the connection is back
        for _ in range(500):
            if len(await admin.contenders(key)) == 1:
                break
            await asyncio.sleep(0.01)
        assert len(await admin.contenders(key)) == 1
        await holder.lock("cd").release()


async def test_a_release_that_cannot_reach_the_server_is_bounded_and_finished_later(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    locks = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(6), prefix=zk.prefix)
    async with locks:
        backend = backend_of(locks)
        session = backend.session
        lock = locks.lock("finish")
        lease = await lock.acquire()
        sid = session.session_id
        proxy.refuse(True)
        proxy.reset()
        await eventually(lambda: not session.connected, scaled(2), "disconnect noticed")
        with pytest.raises(BackendUnavailable):
            await asyncio.wait_for(backend.release(LockRef("lock", "finish"), insides.hold_of(lease)), scaled(5))
        admin = await zk.admin()
        assert len(await admin.contenders(lock.key)) == 1
        proxy.refuse(False)
        # once the session is back, the node goes: it does not outlive its release
        for _ in range(500):
            if not await admin.contenders(lock.key):
                break
            await asyncio.sleep(0.01)
        assert await admin.contenders(lock.key) == []
        assert session.session_id == sid
        await asyncio.wait_for(lease.wait_lost(), scaled(5))


async def test_a_release_finished_later_stops_once_its_session_expired_without_a_request(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    """The background deletion of a released node is moot once its session is over.

    The server deleted the node with the session; the retrying clean-up, woken
    by the reconnect under a new session, sends nothing and ends.
    """
    locks = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(1.5), prefix=zk.prefix)
    async with locks:
        backend = backend_of(locks)
        session = backend.session
        lock = locks.lock("moot")
        lease = await lock.acquire()
        sid = session.session_id
        node = hold_node(backend, insides.hold_of(lease))
        assert node is not None and node.path is not None
        proxy.refuse(True)
        proxy.reset()
        await eventually(lambda: not session.connected, scaled(2), "disconnect noticed")
        with pytest.raises(BackendUnavailable):
            await asyncio.wait_for(backend.release(LockRef("lock", "moot"), insides.hold_of(lease)), scaled(5))
        assert len(zk_nodes(backend).tasks) == 1  # the deletion goes on in the background
        admin = await zk.admin()

        async def expired() -> bool:
            return not await admin.contenders(lock.key)

        await until(expired, "the server expired the session and its node")
        finisher = node.finisher
        assert finisher is not None and not finisher.done()
        sent: list[tuple[int, str]] = []

        def record(conn: Any, request: Any, path: str) -> None:
            if asyncio.current_task() is finisher:
                sent.append((int(request.opcode), path))

        spy_sends(session, record)
        proxy.refuse(False)
        await eventually(lambda: session.connected and session.session_id not in (0, sid), scaled(5), "a new session")
        await eventually(lambda: not zk_nodes(backend).tasks, scaled(5), "the background deletion ended")
        assert hold_node(backend, insides.hold_of(lease)) is None
        assert sent == []
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        async with locks.lock("after"):  # the new session serves
            pass


# -- interop -------------------------------------------------------------------------------


def _kazoo(hosts: str) -> Any:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=15)
    return client


async def test_kazoo_and_asynclock_exclude_each_other(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=scaled(2))
    lock = locks.lock("kazoo")
    client = await asyncio.to_thread(_kazoo, zk.hosts)
    try:
        kazoo_lock = client.Lock(lock.key, "kazoo", extra_lock_patterns=["-lock-"])
        # asynclock holds: kazoo waits
        await lock.acquire()
        from kazoo.exceptions import LockTimeout as KazooTimeout

        with pytest.raises(KazooTimeout):
            await asyncio.to_thread(kazoo_lock.acquire, True, 0.3)
        # kazoo holds: asynclock waits, and gets it when kazoo lets go
        waiting = asyncio.create_task(asyncio.to_thread(kazoo_lock.acquire, True, scaled(10)))
        await asyncio.sleep(0.1)
        await lock.release()
        assert await asyncio.wait_for(waiting, scaled(10))
        with pytest.raises(LockTimeout):
            await lock.acquire(timeout=0)
        mine = asyncio.create_task(_take(lock))
        await asyncio.sleep(0.2)
        assert not mine.done()
        await asyncio.to_thread(kazoo_lock.release)
        token, _ = await asyncio.wait_for(mine, scaled(5))
        assert token is not None
    finally:
        await asyncio.to_thread(client.stop)
        await asyncio.to_thread(client.close)


@pytest.fixture(scope="module")
def curator_program(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Compile the Curator lock program; the command that runs it (minus its arguments)."""
    jars = [
        next(iter(sorted(glob.glob(f"/usr/share/java/{name}.jar"))), None)
        for name in ("curator-recipes", "curator-framework", "curator-client", "slf4j-nop")
    ]
    javac, java = shutil.which("javac"), shutil.which("java")
    if None in jars[:3] or javac is None or java is None:
        pytest.skip("Curator (libcurator-recipes-java) or a JDK is missing: tests/run.sh installs them")
    classpath = os.pathsep.join(jar for jar in jars if jar)
    out = tmp_path_factory.mktemp("curator")
    source = Path(__file__).parent / "servers" / "curator" / "CuratorLock.java"
    subprocess.run([javac, "-cp", classpath, "-d", str(out), str(source)], check=True, timeout=120)
    return [java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", os.pathsep.join([str(out), classpath]), "CuratorLock"]


class _Curator:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def expect(self, word: str, timeout: float) -> None:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.proc.stdout.readline()).decode().strip()
                if not line and self.proc.stdout.at_eof():
                    raise AssertionError(f"Curator exited before {word!r}")
                if line == word:
                    return

    async def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        await self.expect("released", scaled(10))
        await asyncio.wait_for(self.proc.wait(), scaled(10))


@contextlib.asynccontextmanager
async def _curator(command: list[str], hosts: str, path: str) -> AsyncIterator[_Curator]:
    proc = await asyncio.create_subprocess_exec(
        *command, hosts, path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        yield _Curator(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_curator_and_asynclock_exclude_each_other(zk: ZooKeeperHarness, curator_program: list[str]) -> None:
    locks = zk.connect(ttl=scaled(2))
    lock = locks.lock("curator")
    admin = await zk.admin()
    # asynclock first: Curator queues behind us and gets it when we let go
    await lock.acquire()
    async with _curator(curator_program, zk.hosts, lock.key) as curator:
        await curator.expect("connected", scaled(30))
        for _ in range(500):
            if len(await admin.contenders(lock.key)) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(await admin.contenders(lock.key)) == 2
        await asyncio.sleep(0.2)
        await lock.release()
        await curator.expect("acquired", scaled(10))
        # Curator holds: we wait, and get it when Curator lets go
        with pytest.raises(LockTimeout):
            await lock.acquire(timeout=0)
        mine = asyncio.create_task(_take(lock))
        await asyncio.sleep(0.2)
        assert not mine.done()
        await curator.release()
        token, _ = await asyncio.wait_for(mine, scaled(5))
        assert token is not None


# -- ensemble ----------------------------------------------------------------------------------


@pytest.fixture
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    group = ZooKeeperEnsemble()
    group.start()
    yield group
    group.cleanup()


async def _contend_through(ensemble: ZooKeeperEnsemble, fault: Any, heal: Any) -> tuple[int, list[str], list[int]]:
    """Three clients (one on the leader) contend while ``fault`` hits the leader."""
    session_timeout = scaled(6)
    leader = ensemble.leader()
    hosts = list(ensemble.servers.values())
    clients = []
    for index in range(3):
        locks = asynclock.connect(ensemble.url, ttl=session_timeout, prefix="ens")
        target = leader if index == 0 else hosts[index % len(hosts)]
        connect_next_to(backend_of(locks).session, hosts.index(target))
        clients.append(locks)
    inside = 0
    overlaps = 0
    losses: list[str] = []
    done = 0
    stop = asyncio.Event()

    async def worker(locks: asynclock.Locks) -> None:
        nonlocal inside, overlaps, done
        while not stop.is_set():
            try:
                async with locks.lock("ens"):
                    inside += 1
                    overlaps += inside > 1
                    await asyncio.sleep(0.02)
                    inside -= 1
                    done += 1
            except LockLost as exc:
                inside -= 1
                losses.append(exc.reason)
            except BackendUnavailable:
                await asyncio.sleep(0.05)

    for locks in clients:
        await locks.__aenter__()
    on_leader = backend_of(clients[0]).session
    assert connected_host(on_leader) == leader.hostport
    sessions = [backend_of(locks).session.session_id for locks in clients]
    # one lock is held across the fault by the client on the leader, two others queue for it
    let_go = asyncio.Event()
    across: dict[str, Any] = {}

    async def hold_across() -> None:
        async with clients[0].lock("across") as lease:
            across["held"] = lease.token
            await let_go.wait()
            across["lost"] = lease.lost

    async def queue_for_across(locks: asynclock.Locks) -> None:
        async with locks.lock("across") as lease:
            across.setdefault("next", lease.token)

    try:
        holding = asyncio.create_task(hold_across())
        await eventually(lambda: "held" in across, scaled(10), "the lock held across the fault")
        queued = [asyncio.create_task(queue_for_across(locks)) for locks in clients[1:]]
        tasks = [asyncio.create_task(worker(locks)) for locks in clients for _ in range(2)]
        await eventually(lambda: done >= 10, scaled(20), "some rounds before the fault")
        before = done
        await asyncio.to_thread(fault, leader)
        await eventually(lambda: done >= before + 20, scaled(40), "rounds after the fault")
        assert on_leader.reconnects >= 1, "the client on the leader moved to another server"
        assert not any(task.done() for task in queued), "a waiter got a lock that is still held"
        let_go.set()
        await asyncio.wait_for(asyncio.gather(holding, *queued), scaled(20))
        assert across["lost"] is False and across["next"] > across["held"]
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), scaled(30))
    finally:
        stop.set()
        let_go.set()
        await asyncio.to_thread(heal, leader)
        after = [backend_of(locks).session.session_id for locks in clients]
        for locks in clients:
            await locks.aclose()
    return overlaps, losses, [int(a == b) for a, b in zip(sessions, after, strict=True)]


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_ensemble_leader_fault_no_overlap_no_spurious_loss(ensemble: ZooKeeperEnsemble, fault: str) -> None:
    def hit(leader: ZooKeeperServer) -> None:
        if fault == "kill":
            leader.kill()
        else:
            leader.pause()
        ensemble.wait_serving(2)

    def heal(leader: ZooKeeperServer) -> None:
        leader.resume() if fault == "pause" else None

    overlaps, losses, same_session = await _contend_through(ensemble, hit, heal)
    assert overlaps == 0
    assert same_session == [1, 1, 1], "every session survived the leader fault"
    assert losses == [], losses


async def test_inspect_lists_and_describes_zookeeper_locks(zk: ZooKeeperHarness) -> None:
    from asynclock._inspect import collect

    locks = zk.connect(ttl=scaled(2))
    lease = await locks.lock("a/b").acquire()
    infos = await collect(zk.url, [], prefix=zk.prefix)
    [info] = [i for i in infos if i.held]
    assert info.name == "a/b" and info.token == lease.token and info.key == locks.lock("a/b").key
    await locks.lock("a/b").release()


@pytest.mark.slow
async def test_ensemble_survives_repeated_leader_kills_without_overlap(ensemble: ZooKeeperEnsemble) -> None:
    """Torture: the leader is killed and restarted several times while clients contend."""
    clients = [asynclock.connect(ensemble.url, ttl=scaled(6), prefix="torture") for _ in range(3)]
    inside = 0
    overlaps = 0
    tokens: list[int] = []
    stop = asyncio.Event()

    async def worker(locks: asynclock.Locks) -> None:
        nonlocal inside, overlaps
        while not stop.is_set():
            with contextlib.suppress(LockLost, BackendUnavailable):
                async with locks.lock("t") as lease:
                    inside += 1
                    overlaps += inside > 1
                    assert lease.token is not None
                    tokens.append(lease.token)
                    await asyncio.sleep(0.01)
                    inside -= 1

    for locks in clients:
        await locks.__aenter__()
    tasks = [asyncio.create_task(worker(locks)) for locks in clients for _ in range(2)]
    try:
        for _ in range(4):
            leader = await asyncio.to_thread(ensemble.leader)
            before = len(tokens)
            await asyncio.to_thread(leader.kill)
            await asyncio.to_thread(ensemble.wait_serving, 2)
            await eventually(lambda n=before: len(tokens) >= n + 10, scaled(40), "rounds after the kill")
            await asyncio.to_thread(leader.start)
            await asyncio.to_thread(ensemble.wait_serving, 3)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), scaled(30))
        for locks in clients:
            await locks.aclose()
    assert overlaps == 0
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = scaled(10)) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def test_a_queued_wait_that_loses_the_server_ends_unavailable_and_its_node_goes_later(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    """A waiter whose node is queued, cut off from the server, ends with BackendUnavailable at its timeout.

    Leaving the queue while disconnected cannot delete the node now; that is
    the background clean-up's job once the connection is back. Waiting for it
    (up to a session timeout) made the acquire overrun its timeout until the
    front's outer bound cut it, which then reported a plain LockTimeout.
    """
    holder = zk.connect(ttl=scaled(2))
    waiter = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=scaled(6), prefix=zk.prefix)
    async with waiter:
        await holder.lock("gone").acquire()
        key = holder.lock("gone").key
        admin = await zk.admin()
        task = asyncio.create_task(waiter.lock("gone").acquire(timeout=scaled(1)))

        async def queued() -> bool:
            return len(await admin.contenders(key)) == 2

        await until(queued, "the waiter's node queued")
        proxy.refuse(True)
        proxy.reset()
        with pytest.raises(BackendUnavailable):
            await asyncio.wait_for(task, scaled(10))
        proxy.refuse(False)

        async def cleaned() -> bool:
            return len(await admin.contenders(key)) == 1

        # the node is deleted once the (still live) session is connected again
        await until(cleaned, "the waiter's node deleted after the reconnect")
        await holder.lock("gone").release()
