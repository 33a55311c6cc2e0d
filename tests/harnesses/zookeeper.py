"""The ZooKeeper harness: one standalone server per test session, a prefix per test."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from aiozk import protocol
from aiozk.protocol.acl import ACL, ID

from asynclock.abc import LockRef
from asynclock.backends.zookeeper import ZooKeeperBackend
from asynclock.backends.zookeeper._nodes import Node, Nodes
from asynclock.backends.zookeeper._order import contenders_of, rw_holders, sequence
from asynclock.backends.zookeeper._session import ZkSession
from asynclock.backends.zookeeper._wire import NO_NODE, ZkError
from tests.harnesses import Harness
from tests.servers import scaled
from tests.servers.zookeeper import ZooKeeperServer


class AdminClient:
    """A separate ZooKeeper session for the tests: look at and delete nodes server-side.

    ``auth`` = (scheme, credentials), e.g. ``("digest", b"user:password")``,
    for nodes whose ACL wants them.
    """

    def __init__(self, hosts: str, auth: tuple[str, bytes] | None = None) -> None:
        pairs = []
        for item in hosts.split(","):
            host, _, port = item.rpartition(":")
            pairs.append((host, int(port)))
        self.session = ZkSession(pairs, timeout=10.0, auth=[] if auth is None else [auth])

    async def start(self) -> AdminClient:
        await self.session.start(10.0)
        return self

    async def children(self, path: str) -> list[str]:
        try:
            await self.session.wait_connected(10.0)
            reply = await self.session.call(protocol.GetChildrenRequest(path=path, watch=False), path)
        except ZkError as exc:
            if exc.code == NO_NODE:
                return []
            raise
        return list(reply.children)

    async def stat(self, path: str) -> Any | None:
        try:
            reply = await self.session.call(protocol.ExistsRequest(path=path, watch=False), path)
        except ZkError as exc:
            if exc.code == NO_NODE:
                return None
            raise
        return reply.stat

    async def data(self, path: str) -> bytes | None:
        try:
            reply = await self.session.call(protocol.GetDataRequest(path=path, watch=False), path)
        except ZkError as exc:
            if exc.code == NO_NODE:
                return None
            raise
        return bytes(reply.data or b"")

    async def acl(self, path: str) -> list[tuple[str, str, int]]:
        """The ACL of ``path``: (scheme, id, permissions) each."""
        reply = await self.session.call(protocol.GetACLRequest(path=path), path)
        return [(entry.id.scheme, entry.id.id, entry.perms) for entry in reply.acl]

    async def create(self, path: str, acl: list[tuple[str, str, int]] | None = None) -> None:
        """A persistent node, with ``acl`` (scheme, id, permissions) each, default open to all."""
        entries = [
            ACL(perms=perms, id=ID(scheme=scheme, id=ident))
            for scheme, ident, perms in (acl or [("world", "anyone", 31)])
        ]
        await self.session.call(protocol.CreateRequest(path=path, data=b"", acl=entries, flags=0), path)

    async def delete(self, path: str) -> bool:
        try:
            await self.session.call(protocol.DeleteRequest(path=path, version=-1), path)
        except ZkError as exc:
            if exc.code == NO_NODE:
                return False
            raise
        return True

    async def delete_tree(self, path: str) -> None:
        for child in await self.children(path):
            await self.delete_tree(f"{path}/{child}")
        await self.delete(path)

    async def contenders(self, path: str) -> list[str]:
        """Full paths of the lock contenders under ``path``, holder first."""
        return [f"{path}/{child}" for child in contenders_of(await self.children(path))]

    async def close(self) -> None:
        await self.session.close(1.0)


def spy_sends(session: ZkSession, record: Callable[[Any, Any, str], None]) -> None:
    """Call ``record(conn, request, path)`` on every request the session sends, just before it is sent."""
    original = session._send

    def spy(conn: Any, request: Any, path: str, watch: Any = None) -> asyncio.Future[Any]:
        record(conn, request, path)
        return original(conn, request, path, watch)

    session._send = spy  # type: ignore[method-assign]


def zk_nodes(backend: ZooKeeperBackend) -> Nodes:
    """The ZooKeeper client's lock nodes: their parents, their creation, their background deletions."""
    return backend._nodes


def hold_node(backend: ZooKeeperBackend, hold: str) -> Node | None:
    """The node of the ZooKeeper client's hold ``hold`` (None once it is forgotten)."""
    return backend._holds.get(hold)


def connect_next_to(session: ZkSession, index: int) -> None:
    """Make the session's next connection go to the server at ``index`` of its host list."""
    session._servers.next = index


def connected_host(session: ZkSession) -> str | None:
    """The server of the session's current connection (None while it has none)."""
    conn = session._conn
    return None if conn is None else conn.host


class ZooKeeperHarness(Harness):
    kind = "zookeeper"
    can_pause = True
    server_counts = False  # the hold count lives in the client

    def __init__(self, server: ZooKeeperServer, hosts: str | None = None) -> None:
        super().__init__()
        self.server = server
        self.hosts = hosts or server.hostport
        self._admin: AdminClient | None = None
        # for key computation only (no I/O)
        self._keys = ZooKeeperBackend([("127.0.0.1", server.port)], prefix=self.prefix)

    @property
    def url(self) -> str:
        return f"zk://{self.hosts}"

    @property
    def base(self) -> str:
        return self._keys.lock_key(LockRef("lock", "x")).rsplit("/", 1)[0]

    async def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = await AdminClient(self.hosts).start()
        return self._admin

    async def expire(self, name: str) -> bool:
        """Delete the holder's lock node server-side: how a ZooKeeper lock is lost."""
        admin = await self.admin()
        holders = await admin.contenders(self._keys.lock_key(LockRef("lock", name)))
        return bool(holders) and await admin.delete(holders[0])

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Delete the nodes that hold the primitive ``kind`` of ``name``, as an administrator would."""
        if kind in ("fair", "lock"):
            return await self.expire(name)
        admin = await self.admin()
        key = self._keys.lock_key(LockRef(kind, name))  # type: ignore[arg-type]
        if kind == "semaphore":
            holders = await admin.contenders(f"{key}/leases")  # every lease: any permit count
        else:
            holders = [f"{key}/{child}" for child in rw_holders(contenders_of(await admin.children(key)))]
        deleted = [await admin.delete(path) for path in holders]
        return any(deleted)

    async def leftovers(self) -> list[str]:
        """Every contender node (a name ending in a sequence number) anywhere under the prefix."""
        admin = await self.admin()

        async def walk(path: str) -> list[str]:
            found = []
            for child in await admin.children(path):
                if sequence(child) is not None:
                    found.append(f"{path}/{child}")
                else:
                    found += await walk(f"{path}/{child}")
            return found

        return await walk(self.base)

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.delete_tree(self.base)
            await self._admin.close()


class CuratorProgram:
    """A Curator program of the interop tests (``tests/servers/curator``), talked to line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def expect_line(self, wanted: Callable[[str], bool], what: str, timeout: float | None = None) -> str:
        """The first line the program prints that is ``wanted``."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout or scaled(30)):
            while True:
                line = (await self.proc.stdout.readline()).decode().strip()
                if not line and self.proc.stdout.at_eof():
                    raise AssertionError(f"Curator exited before {what}")
                if wanted(line):
                    return line

    async def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{word}\n".encode())
        await self.proc.stdin.drain()


Program = TypeVar("Program", bound=CuratorProgram)


@contextlib.asynccontextmanager
async def curator_program(
    kind: type[Program], command: list[str], zk: ZooKeeperHarness, *args: str
) -> AsyncIterator[Program]:
    """``command`` run against ``zk`` with ``args``, once it says it is connected; killed at the end."""
    proc = await asyncio.create_subprocess_exec(
        *command, zk.hosts, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        program = kind(proc)
        await program.expect_line(lambda line: line.startswith("connected"), "'connected'")
        yield program
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
