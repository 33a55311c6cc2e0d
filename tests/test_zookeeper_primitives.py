"""The fair lock, the read-write lock and the semaphore on ZooKeeper, against a real server.

Their layout on the server (Curator's node names, so Curator's
InterProcessReadWriteLock and InterProcessSemaphoreV2 take part on the same
paths, which is tested in both directions with Curator itself), which nodes
each waiter watches (no herd), cancellation leaving no node behind, and a
SIGKILLed holder process whose permit comes back once its session expires.
The generic semantics (FIFO, readers and writers, permits) are in
``test_primitives.py`` and the contract suite in ``test_shapes.py``.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

import asynclock
from asynclock import LockTimeout
from asynclock.abc import LockRef
from asynclock.backends.zookeeper import ZooKeeperBackend
from asynclock.backends.zookeeper._order import contenders_of
from tests.harnesses.zookeeper import CuratorProgram, ZooKeeperHarness, curator_program
from tests.servers import scaled
from tests.servers.proxy import TcpProxy
from tests.servers.zookeeper import ZooKeeperServer, four_letter

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)
SHORT = scaled(0.3)
GUID = r"_c_[0-9a-f-]{36}"


@pytest.fixture
async def zk(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperHarness]:
    harness = ZooKeeperHarness(zookeeper_server)
    async with harness:
        yield harness


def backend_of(locks: asynclock.Locks) -> ZooKeeperBackend:
    backend = locks.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def watchers(port: int) -> dict[str, set[int]]:
    """Path → the session ids watching it, from the server's ``wchp``."""
    found: dict[str, set[int]] = {}
    current = None
    for line in four_letter(port, b"wchp").decode().splitlines():
        if line.startswith("/"):
            current = line.strip()
            found[current] = set()
        elif line.strip().startswith("0x") and current is not None:
            found[current].add(int(line.strip(), 16))
    return found


def child_watches(port: int, data_watches: dict[str, set[int]]) -> int:
    """How many children watches the server has: all its watches (``mntr``) less the data ones (``wchp``)."""
    stats = dict(line.split("\t", 1) for line in four_letter(port, b"mntr").decode().splitlines() if "\t" in line)
    return int(stats["zk_watch_count"]) - sum(len(sids) for sids in data_watches.values())


async def owners(zk: ZooKeeperHarness, paths: list[str]) -> list[int]:
    admin = await zk.admin()
    found = []
    for path in paths:
        stat = await admin.stat(path)
        assert stat is not None, path
        found.append(stat.ephemeral_owner)
    return found


async def count_nodes(zk: ZooKeeperHarness, path: str, count: int) -> list[str]:
    """Wait (bounded) until ``path`` has ``count`` contenders; their full paths, in order."""
    admin = await zk.admin()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(10)
    while True:
        found = await admin.contenders(path)
        if len(found) == count:
            return found
        assert loop.time() < deadline, f"{path}: {found}, wanted {count}"
        await asyncio.sleep(0.01)


# -- layout ---------------------------------------------------------------------------


async def test_fair_lock_is_the_plain_lock_on_the_same_path(zk: ZooKeeperHarness) -> None:
    locks, other = zk.connect(ttl=TTL), zk.connect(ttl=TTL)
    fair = locks.lock("same", fair=True)
    plain = locks.lock("same")
    assert fair.key == plain.key
    backend = backend_of(locks)
    assert backend.lock_key(LockRef("fair", "same")) == backend.lock_key(LockRef("lock", "same")) == plain.key
    lease = await fair.acquire()
    [node] = await (await zk.admin()).contenders(fair.key)
    assert re.fullmatch(GUID + r"-lock-\d{10}", node.rsplit("/", 1)[1])
    with pytest.raises(LockTimeout):  # one resource: the plain lock of that name is taken
        await other.lock("same").acquire(timeout=0)
    stat = await (await zk.admin()).stat(node)
    assert stat is not None and lease.token == stat.created_zxid
    await fair.release()
    async with other.lock("same"):
        with pytest.raises(LockTimeout):
            await locks.lock("same", fair=True).acquire(timeout=0)


async def test_read_write_layout_is_curators(zk: ZooKeeperHarness) -> None:
    readers = [zk.connect(ttl=TTL) for _ in range(2)]
    writer = zk.connect(ttl=TTL)
    rw = readers[0].rw_lock("doc")
    key = rw.read.key
    assert key == rw.write.key and key.endswith("/%rw/doc")
    assert rw.read.key != readers[0].lock("doc").key  # a plain lock "doc" is something else
    first = await rw.read.acquire()
    second = await readers[1].rw_lock("doc").read.acquire(timeout=0)
    waiting = Holder(writer.rw_lock("doc").write)
    nodes = await count_nodes(zk, key, 3)
    names = [path.rsplit("/", 1)[1] for path in nodes]
    assert re.fullmatch(GUID + r"-__READ__\d{10}", names[0])
    assert re.fullmatch(GUID + r"-__READ__\d{10}", names[1])
    assert re.fullmatch(GUID + r"-__WRIT__\d{10}", names[2])
    info = await rw.write.info()
    assert info.waiters == 1 and len(info.holders) == 2
    # tokens are czxids: the writer's is above both readers'
    await readers[0].rw_lock("doc").read.release()
    await readers[1].rw_lock("doc").read.release()
    lease = await waiting.got()
    assert first.token is not None and second.token is not None and lease.token is not None
    assert lease.token > max(first.token, second.token)
    [held] = await (await zk.admin()).contenders(key)
    stat = await (await zk.admin()).stat(held)
    assert stat is not None and stat.created_zxid == lease.token
    await waiting.release()


async def test_semaphore_layout_is_curators_v2(zk: ZooKeeperHarness) -> None:
    locks = zk.connect(ttl=TTL)
    sem = locks.semaphore("pool", permits=2)
    assert sem.key.endswith("/%semaphore/pool")
    lease = await sem.acquire()
    admin = await zk.admin()
    [node] = await admin.contenders(f"{sem.key}/leases")
    assert re.fullmatch(GUID + r"-lease-\d{10}", node.rsplit("/", 1)[1])
    stat = await admin.stat(node)
    assert stat is not None and lease.token == stat.created_zxid
    assert stat.ephemeral_owner == backend_of(locks).session.session_id
    # the mutex is let go (in the background) once the permit is held
    await count_nodes(zk, f"{sem.key}/locks", 0)
    # every permit's token is its lease node's czxid, so later permits get larger ones
    other = Holder(locks.semaphore("pool", permits=2))
    second = await other.got()
    assert second.token is not None and lease.token is not None and second.token > lease.token
    assert len(await admin.contenders(f"{sem.key}/leases")) == 2
    await sem.release()
    await other.release()


class Holder:
    """Acquire ``handle`` in a task of its own (its owner) and hold it until ``release()``."""

    def __init__(self, handle: asynclock.Lock) -> None:
        self._done = asyncio.Event()
        self._lease: asyncio.Future[asynclock.Lease] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(handle))

    async def _run(self, handle: asynclock.Lock) -> None:
        lease = await handle.acquire()
        self._lease.set_result(lease)
        await self._done.wait()
        await handle.release()

    async def got(self) -> asynclock.Lease:
        either: list[asyncio.Future[Any]] = [self.task, self._lease]
        await asyncio.wait(either, timeout=scaled(10), return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            self.task.result()  # its error, if it failed
        return self._lease.result()

    async def release(self) -> None:
        await self.got()
        self._done.set()
        await asyncio.wait_for(self.task, scaled(10))


# -- watches: no herd -------------------------------------------------------------------


async def test_writers_watch_the_node_ahead_and_readers_the_writer_ahead(zk: ZooKeeperHarness) -> None:
    clients = [zk.connect(ttl=scaled(2)) for _ in range(5)]
    holder = clients[0].rw_lock("herd")
    await holder.write.acquire()
    key = holder.write.key
    # queue: W(held) R R W R
    tasks = []
    for client, side in zip(clients[1:], ["read", "read", "write", "read"], strict=True):
        rw = client.rw_lock("herd")
        # (detached: a lease that its task, which ends with the acquire, would otherwise give back)
        tasks.append(asyncio.create_task((rw.read if side == "read" else rw.write).acquire(detached=True)))
        await count_nodes(zk, key, len(tasks) + 1)
    await asyncio.sleep(0.1)
    nodes = await count_nodes(zk, key, 5)
    sids = await owners(zk, nodes)
    seen = watchers(zk.server.port)

    def watching(index: int) -> set[int]:
        return {sid for sid in seen.get(nodes[index], set()) if sid != sids[index]}

    assert watching(0) == {sids[1], sids[2]}  # both readers wait for the holding writer
    assert watching(1) == set()
    assert watching(2) == {sids[3]}  # the writer waits for the node just ahead
    assert watching(3) == {sids[4]}  # the last reader waits for the writer ahead of it
    assert watching(4) == set()
    await holder.write.release()
    readers = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[1]), scaled(5))
    assert all(not lease.lost for lease in readers)
    await asyncio.sleep(0.1)  # (a writer let in wrongly would be in by now)
    assert not tasks[2].done() and not tasks[3].done()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for lease in readers:
        await lease.release()


async def test_semaphore_waiters_queue_on_the_mutex_and_one_watches_the_leases(zk: ZooKeeperHarness) -> None:
    holder = zk.connect(ttl=scaled(2))
    waiters = [zk.connect(ttl=scaled(2)) for _ in range(3)]
    sem = holder.semaphore("herd", permits=1)
    await sem.acquire()
    tasks = [asyncio.create_task(client.semaphore("herd", permits=1).acquire()) for client in waiters]
    mutexes = await count_nodes(zk, f"{sem.key}/locks", 3)
    leases = await count_nodes(zk, f"{sem.key}/leases", 2)  # the holder's, and the mutex holder's
    await asyncio.sleep(0.1)
    seen = watchers(zk.server.port)
    mutex_sids = await owners(zk, mutexes)
    # one children watch on the whole server (the mutex holder's, on the leases);
    # the other waiters each watch the mutex node just ahead
    assert child_watches(zk.server.port, seen) == 1
    for index in range(2):
        others = {sid for sid in seen.get(mutexes[index], set()) if sid != mutex_sids[index]}
        assert others == {mutex_sids[index + 1]}
    assert mutex_sids[0] == (await owners(zk, leases[1:]))[0]
    info = await sem.info()
    assert info.waiters == 3 and len(info.holders) == 1
    await sem.release()
    done, pending = await asyncio.wait(tasks, timeout=scaled(5), return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and len(pending) == 2
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- cancellation ------------------------------------------------------------------------


async def test_cancelled_waiters_leave_no_node(zk: ZooKeeperHarness) -> None:
    holder = zk.connect(ttl=TTL)
    waiting = zk.connect(ttl=TTL)
    sem = holder.semaphore("c", permits=1)
    rw = holder.rw_lock("c")
    await sem.acquire()
    await rw.read.acquire()
    tasks = [
        asyncio.create_task(waiting.semaphore("c", permits=1).acquire()),  # waits on the leases
        asyncio.create_task(waiting.semaphore("c", permits=1).acquire()),  # waits on the mutex
        asyncio.create_task(waiting.rw_lock("c").write.acquire()),
    ]
    await count_nodes(zk, f"{sem.key}/locks", 2)
    await count_nodes(zk, f"{sem.key}/leases", 2)
    await count_nodes(zk, rw.write.key, 2)
    more = asyncio.create_task(waiting.rw_lock("c").read.acquire())  # behind the waiting writer
    await count_nodes(zk, rw.write.key, 3)
    for task in [*tasks, more]:
        task.cancel()
    results = await asyncio.gather(*tasks, more, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results), results
    admin = await zk.admin()
    # a cancelled acquire returns once its nodes are gone
    assert await admin.contenders(f"{sem.key}/locks") == []
    assert len(await admin.contenders(f"{sem.key}/leases")) == 1
    assert len(await admin.contenders(rw.write.key)) == 1
    await sem.release()
    await rw.read.release()
    assert await zk.leftovers() == []


# -- session loss ------------------------------------------------------------------------


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", zookeeper_server.port) as tcp:
        yield tcp


async def test_a_cut_holder_loses_its_read_hold_and_permit_before_others_get_them(
    zk: ZooKeeperHarness, proxy: TcpProxy
) -> None:
    session_timeout = scaled(1.0)
    holder = asynclock.connect(f"zk://127.0.0.1:{proxy.port}", ttl=session_timeout, prefix=zk.prefix)
    successor = zk.connect(ttl=scaled(3))
    loop = asyncio.get_running_loop()
    lost: dict[str, float] = {}

    async def take(handle: asynclock.Lock) -> float:
        async with handle:
            return loop.time()
        raise AssertionError("unreachable: the block returns or raises")

    async def watch(what: str, lease: asynclock.Lease) -> None:
        await lease.wait_lost()
        lost[what] = loop.time()

    async with holder:
        read = await holder.rw_lock("cut").read.acquire()
        permit = await holder.semaphore("cut", permits=1).acquire()
        watchers_ = [asyncio.create_task(watch("read", read)), asyncio.create_task(watch("permit", permit))]
        write = asyncio.create_task(take(successor.rw_lock("cut").write))
        other = asyncio.create_task(take(successor.semaphore("cut", permits=1)))
        await count_nodes(zk, holder.rw_lock("cut").write.key, 2)
        proxy.blackhole()  # the holder's session expires on the server: its nodes go
        try:
            written, permitted = await asyncio.wait_for(asyncio.gather(write, other), scaled(20))
            await asyncio.wait_for(asyncio.gather(*watchers_), scaled(5))
        finally:
            proxy.heal()
    # each hold was given up (its body would have been cancelled) before anyone else got it
    assert lost["read"] < written
    assert lost["permit"] < permitted


# -- a killed holder process -------------------------------------------------------------

_HOLDER = """
import asyncio, sys
import asynclock

async def main():
    locks = asynclock.connect(sys.argv[1], ttl=float(sys.argv[3]), prefix=sys.argv[2])
    lease = await locks.semaphore("killed", permits=1).acquire()
    print("acquired", lease.token, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_sigkilled_holders_permit_comes_back_when_its_session_expires(zk: ZooKeeperHarness) -> None:
    session = scaled(1.0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        zk.url,
        zk.prefix,
        str(session),
        stdout=subprocess.PIPE,
        cwd=str(Path(__file__).parent.parent),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), scaled(30))).decode().split()
        assert line[:1] == ["acquired"], line
        dead_token = int(line[1])
        locks = zk.connect(ttl=session)
        sem = locks.semaphore("killed", permits=1)
        with pytest.raises(LockTimeout):
            await sem.acquire(timeout=0)
        admin = await zk.admin()
        [dead_node] = await admin.contenders(f"{sem.key}/leases")
        dead = await admin.stat(dead_node)
        assert dead is not None and dead.created_zxid == dead_token
        proc.kill()
        await proc.wait()
        lease = await sem.acquire(timeout=session * 2 + scaled(10))
        # granted because the server expired the dead session and with it the node
        assert await admin.stat(dead_node) is None
        assert lease.token is not None and lease.token > dead_token
        await sem.release()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- Curator -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curator_primitive(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Compile the Curator primitives program; the command that runs it (minus its arguments)."""
    jars = [
        next(iter(sorted(glob.glob(f"/usr/share/java/{name}.jar"))), None)
        for name in ("curator-recipes", "curator-framework", "curator-client", "slf4j-nop")
    ]
    javac, java = shutil.which("javac"), shutil.which("java")
    if None in jars[:3] or javac is None or java is None:
        pytest.skip("Curator (libcurator-recipes-java) or a JDK is missing: tests/run.sh installs them")
    classpath = os.pathsep.join(jar for jar in jars if jar)
    out = tmp_path_factory.mktemp("curator-primitive")
    source = Path(__file__).parent / "servers" / "curator" / "CuratorPrimitive.java"
    subprocess.run([javac, "-cp", classpath, "-d", str(out), str(source)], check=True, timeout=120)
    return [
        java,
        "-Xmx128m",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        os.pathsep.join([str(out), classpath]),
        "CuratorPrimitive",
    ]


class Curator(CuratorProgram):
    """One Curator process holding (or trying to hold) one primitive."""

    async def expect(self, *words: str, timeout: float | None = None) -> str:
        """The first of ``words`` the program prints."""
        return await self.expect_line(lambda line: line in words, repr(words), timeout)

    async def release(self) -> None:
        await self.send("go")
        await self.expect("released")
        await asyncio.wait_for(self.proc.wait(), scaled(10))


def curator(command: list[str], zk: ZooKeeperHarness, *args: str) -> AbstractAsyncContextManager[Curator]:
    return curator_program(Curator, command, zk, *args)


async def test_a_curator_writer_excludes_our_readers_and_writers(
    zk: ZooKeeperHarness, curator_primitive: list[str]
) -> None:
    locks, other = zk.connect(ttl=scaled(2)), zk.connect(ttl=scaled(2))
    rw = locks.rw_lock("interop")
    async with curator(curator_primitive, zk, "write", rw.write.key) as writer:
        await writer.expect("acquired")
        with pytest.raises(LockTimeout):
            await rw.read.acquire(timeout=0)
        with pytest.raises(LockTimeout):
            await other.rw_lock("interop").write.acquire(timeout=SHORT)
        reading = Holder(rw.read)
        await count_nodes(zk, rw.read.key, 2)
        await asyncio.sleep(0.1)
        assert not reading.task.done()
        await writer.release()
        lease = await reading.got()
        assert not lease.lost
    # and a Curator reader shares with our reader
    async with curator(curator_primitive, zk, "read", rw.read.key) as reader:
        assert await reader.expect("acquired") == "acquired"
        with pytest.raises(LockTimeout):
            await other.rw_lock("interop").write.acquire(timeout=0)
        await reader.release()
    await reading.release()


async def test_our_writer_excludes_curator_readers(zk: ZooKeeperHarness, curator_primitive: list[str]) -> None:
    locks = zk.connect(ttl=scaled(2))
    rw = locks.rw_lock("interop2")
    await rw.write.acquire()
    async with curator(curator_primitive, zk, "read", rw.read.key, "1", str(int(SHORT * 1000))) as quick:
        assert await quick.expect("acquired", "timeout") == "timeout"
    async with curator(curator_primitive, zk, "read", rw.read.key) as reader:
        await count_nodes(zk, rw.read.key, 2)
        await asyncio.sleep(0.2)
        await rw.write.release()
        assert await reader.expect("acquired", "timeout") == "acquired"
        # Curator reads: our writer waits for it
        with pytest.raises(LockTimeout):
            await rw.write.acquire(timeout=0)
        await reader.release()
    async with rw.write:
        pass


async def test_curator_semaphore_v2_and_ours_share_the_permits(
    zk: ZooKeeperHarness, curator_primitive: list[str]
) -> None:
    locks, other = zk.connect(ttl=scaled(2)), zk.connect(ttl=scaled(2))
    sem = locks.semaphore("pool", permits=2)
    async with curator(curator_primitive, zk, "semaphore", sem.key, "2") as first:
        assert await first.expect("acquired", "timeout") == "acquired"
        await sem.acquire(timeout=0)  # the second permit
        with pytest.raises(LockTimeout):
            await other.semaphore("pool", permits=2).acquire(timeout=0)
        async with curator(curator_primitive, zk, "semaphore", sem.key, "2", str(int(SHORT * 1000))) as late:
            assert await late.expect("acquired", "timeout") == "timeout"
        # a waiting Curator client gets the permit we give back
        async with curator(curator_primitive, zk, "semaphore", sem.key, "2") as waiting:
            await count_nodes(zk, f"{sem.key}/leases", 3)
            await sem.release()
            assert await waiting.expect("acquired", "timeout") == "acquired"
            with pytest.raises(LockTimeout):
                await other.semaphore("pool", permits=2).acquire(timeout=0)
            # and we wait for a permit Curator gives back
            taking = Holder(other.semaphore("pool", permits=2))
            await count_nodes(zk, f"{sem.key}/leases", 3)
            await asyncio.sleep(0.1)
            assert not taking.task.done()
            await first.release()
            lease = await taking.got()
            assert not lease.lost
            await waiting.release()
        await taking.release()
    assert contenders_of(await (await zk.admin()).children(f"{sem.key}/leases")) == []
