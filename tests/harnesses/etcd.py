"""The etcd harness: one single-member etcd per test session, a key prefix per test."""

from __future__ import annotations

from asynclock.abc import LockRef
from asynclock.backends.etcd import EtcdBackend
from asynclock.backends.etcd._client import EtcdClient
from asynclock.backends.etcd._queue import Queue
from asynclock.backends.etcd._recipe import rw_holders
from asynclock.backends.etcd._replies import KeyValue
from asynclock.backends.etcd._wire import ASCEND, SORT_CREATE, prefix_end, range_request
from tests.harnesses import Harness
from tests.servers.etcd import EtcdServer

#: How long an admin request may take.
_TIMEOUT = 5.0


def etcd_queue(backend: EtcdBackend) -> Queue:
    """The etcd client's queue of waiters, with its background work (releases finished later)."""
    return backend._queue


class AdminClient:
    """A separate etcd client for the tests: look at and delete keys server-side."""

    def __init__(self, hosts: str) -> None:
        pairs = []
        for item in hosts.split(","):
            host, _, port = item.rpartition(":")
            pairs.append((host, int(port)))
        self.client = EtcdClient(pairs)

    async def keys(self, prefix: str) -> list[KeyValue]:
        """Every key under ``prefix``, in create order."""
        start = prefix.encode()
        request = range_request(start, prefix_end(start), keys_only=True, sort_order=ASCEND, sort_target=SORT_CREATE)
        return (await self.client.range(request, _TIMEOUT)).kvs

    async def delete(self, key: bytes) -> bool:
        return (await self.client.delete(key, _TIMEOUT)).count > 0

    async def delete_prefix(self, prefix: str) -> int:
        start = prefix.encode()
        return (await self.client.delete(start, _TIMEOUT, prefix_end(start))).count

    async def close(self) -> None:
        await self.client.close()


class EtcdHarness(Harness):
    kind = "etcd"
    can_pause = True
    server_counts = False  # the hold count lives in the client

    def __init__(self, server: EtcdServer, hosts: str | None = None) -> None:
        super().__init__()
        self.server = server
        self.hosts = hosts or server.hostport
        self._admin: AdminClient | None = None
        # for key computation only (no I/O)
        self._keys = EtcdBackend([("127.0.0.1", server.port)], prefix=self.prefix)

    @property
    def url(self) -> str:
        return f"etcd://{self.hosts}"

    async def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.hosts)
        return self._admin

    async def expire(self, name: str) -> bool:
        """Delete the holder's key server-side, as an administrator would."""
        admin = await self.admin()
        contenders = await admin.keys(self._keys.lock_key(LockRef("lock", name)) + "/")
        return bool(contenders) and await admin.delete(contenders[0].key)

    async def expire_shape(self, kind: str, name: str) -> bool:
        """Delete the keys that hold the primitive ``kind`` of ``name``."""
        if kind in ("fair", "lock"):
            return await self.expire(name)
        admin = await self.admin()
        key = self._keys.lock_key(LockRef(kind, name))  # type: ignore[arg-type]
        if kind == "election":
            leader = (await admin.keys(f"{key}/"))[:1]
            return bool(leader) and await admin.delete(leader[0].key)
        if kind == "semaphore":
            holders = await admin.keys(f"{key}/leases/")  # every lease: any permit count
        else:
            holders = rw_holders(await admin.keys(f"{key}/"), key)
        deleted = [await admin.delete(kv.key) for kv in holders]
        return any(deleted)

    async def leftovers(self) -> list[str]:
        """Every key under the test's prefix."""
        admin = await self.admin()
        return [kv.key.decode(errors="replace") for kv in await admin.keys(f"{self.prefix}/")]

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.delete_prefix(f"{self.prefix}/")
            await self._admin.close()
