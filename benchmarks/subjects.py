"""What is measured: asynclock's backends, the peer libraries, and raw floors.

Every subject is driven the same way. A process opens one *client* (shared by
all its workers, as a service shares one client between its tasks or
threads), then makes one *handle* per worker; a handle only knows
``acquire()`` (wait until held) and ``release()``. Asyncio subjects run their
workers as tasks; the synchronous peers (python-redis-lock, kazoo) run theirs
as threads, the way they are used.

A subject whose library is not installed is reported as such, never silently
dropped (see :func:`missing`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Protocol

#: Lease time used by every subject that has one (long: no renewals or expiry during a run).
TTL = 10.0


class AsyncHandle(Protocol):
    async def acquire(self) -> None: ...
    async def release(self) -> None: ...


class SyncHandle(Protocol):
    def acquire(self) -> None: ...
    def release(self) -> None: ...


@dataclass(frozen=True)
class Subject:
    key: str  # unique id, used in JSON and on the command line
    label: str  # what the table shows
    backend: str  # memory | redis | zookeeper | postgres | mysql | etcd
    threads: bool  # synchronous library, workers are threads
    floor: bool  # a raw floor, not a lock library
    contended: bool  # takes part in the contention and herd runs
    needs: tuple[str, ...]  # importable modules it needs
    note: str = ""
    before: bool = False  # asynclock at an earlier revision (``--before REV``)

    def missing(self) -> list[str]:
        return [module for module in self.needs if importlib.util.find_spec(module) is None]


SUBJECTS: list[Subject] = [
    Subject("asynclock-memory", "asynclock memory://", "memory", False, False, True, ("asynclock",)),
    Subject("raw-redis", "raw SET NX PX + Lua compare-and-delete", "redis", False, True, False, ("redis",)),
    Subject("asynclock-redis", "asynclock redis://", "redis", False, False, True, ("redis",)),
    Subject("asynclock-redis-fair", "asynclock redis:// fair", "redis", False, False, True, ("redis",)),
    Subject("redis-py-0.1", "redis-py Lock (sleep=0.1)", "redis", False, False, True, ("redis",)),
    Subject("redis-py-0.001", "redis-py Lock (sleep=0.001)", "redis", False, False, True, ("redis",)),
    Subject("python-redis-lock", "python-redis-lock (threads)", "redis", True, False, True, ("redis", "redis_lock")),
    Subject("pottery", "pottery AIORedlock (1 master)", "redis", False, False, True, ("redis", "pottery")),
    Subject("raw-zookeeper", "raw create(ephemeral) + delete (aiozk)", "zookeeper", False, True, False, ("aiozk",)),
    Subject("asynclock-zookeeper", "asynclock zk://", "zookeeper", False, False, True, ("aiozk",)),
    Subject("aiozk", "aiozk Lock recipe", "zookeeper", False, False, True, ("aiozk",)),
    Subject("kazoo", "kazoo Lock (threads)", "zookeeper", True, False, True, ("kazoo",)),
    Subject("raw-postgres", "raw pg_advisory_lock + unlock (asyncpg)", "postgres", False, True, True, ("asyncpg",)),
    Subject("asynclock-postgres", "asynclock postgresql://", "postgres", False, False, True, ("asyncpg",)),
    Subject("raw-mysql", "raw GET_LOCK + RELEASE_LOCK (asyncmy)", "mysql", False, True, True, ("asyncmy",)),
    Subject(
        "raw-mysql-token",
        "raw GET_LOCK with its token row + RELEASE_LOCK (asyncmy)",
        "mysql",
        False,
        True,
        False,
        ("asyncmy",),
        note="asynclock's statement: the lock and its fencing token in one InnoDB commit",
    ),
    Subject("asynclock-mysql", "asynclock mysql://", "mysql", False, False, True, ("asyncmy",)),
    Subject("raw-etcd", "raw Put(lease) + Delete (grpc)", "etcd", False, True, False, ("grpc",)),
    Subject("asynclock-etcd", "asynclock etcd://", "etcd", False, False, True, ("grpc",)),
]

BY_KEY = {subject.key: subject for subject in SUBJECTS}

#: Where ``--before REV`` put a copy of asynclock at REV (as the package ``asynclock_before``), and REV:
#: set in the environment, so that the worker processes measure the same copy.
BEFORE_ENV = "ASYNCLOCK_BENCH_BEFORE"
#: The backends whose module names say they exist in a copy of asynclock.
_BACKEND_MODULES = {
    "memory": "memory",
    "redis": "redis",
    "zookeeper": "zookeeper",
    "postgres": "postgres",
    "mysql": "mysql",
    "etcd": "etcd",
}


def add_before(where: str, rev: str) -> list[Subject]:
    """Measure the copy of asynclock in ``where`` (``asynclock_before``, from ``rev``) beside the working tree.

    One subject per backend the copy has, keyed ``before-<backend>``, with the
    backend's server, in the uncontended, contended and herd runs.
    """
    if where not in sys.path:
        sys.path.insert(0, where)
    backends = os.path.join(where, "asynclock_before", "backends")
    added = []
    for backend, module in _BACKEND_MODULES.items():
        if not (
            os.path.exists(os.path.join(backends, module + ".py")) or os.path.isdir(os.path.join(backends, module))
        ):
            continue
        key = f"before-{backend}"
        if key in BY_KEY:
            continue
        scheme = {"zookeeper": "zk", "postgres": "postgresql"}.get(backend, backend)  # (mysql: mysql://)
        twin = BY_KEY[f"asynclock-{backend}"]
        subject = Subject(key, f"asynclock {scheme}:// at {rev}", backend, False, False, True, twin.needs, before=True)
        SUBJECTS.append(subject)
        BY_KEY[key] = subject
        added.append(subject)
    return added


if os.environ.get(BEFORE_ENV):
    add_before(*os.environ[BEFORE_ENV].split("\n", 1))

#: The peers that are not part of asynclock (``--no-peers`` leaves them out).
PEERS = {"redis-py-0.1", "redis-py-0.001", "python-redis-lock", "pottery", "aiozk", "kazoo"}


# -- asyncio clients ----------------------------------------------------------


class AsyncClient:
    """One process's client of one subject; ``handle()`` makes a worker's lock."""

    async def open(self, url: str) -> None:
        raise NotImplementedError

    def handle(self, name: str) -> AsyncHandle:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def round_trips(self) -> int | None:
        """Requests sent so far, where the subject counts them (None: not counted)."""
        return None


class AsynclockClient(AsyncClient):
    def __init__(self, fair: bool = False, module: str = "asynclock") -> None:
        self.locks: Any = None
        self.fair = fair
        self.module = module  # asynclock, or a copy of it at another revision

    async def open(self, url: str) -> None:
        asynclock = importlib.import_module(self.module)
        self.locks = asynclock.connect(url, ttl=TTL)
        await self.locks.__aenter__()

    def handle(self, name: str) -> AsyncHandle:
        return _AsynclockHandle(self.locks.lock(name, fair=True) if self.fair else self.locks.lock(name))

    async def close(self) -> None:
        await self.locks.aclose()

    def round_trips(self) -> int | None:
        client = getattr(self.locks.backend, "client", None)
        requests = getattr(client, "requests", None)  # the etcd backend counts what it sends
        return requests if isinstance(requests, int) else None


class _AsynclockHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    async def acquire(self) -> None:
        await self.lock.acquire()

    async def release(self) -> None:
        await self.lock.release()


class RawRedisClient(AsyncClient):
    """The floor: one SET NX PX to take, one owner-checked delete (Lua) to give back."""

    RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

    async def open(self, url: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(url)
        self.release_script = self.client.register_script(self.RELEASE)
        await self.client.ping()

    def handle(self, name: str) -> AsyncHandle:
        return _RawRedisHandle(self, f"raw:{name}")

    async def close(self) -> None:
        await self.client.aclose()


class _RawRedisHandle:
    def __init__(self, owner: RawRedisClient, key: str) -> None:
        self.owner = owner
        self.key = key
        self.token = b""

    async def acquire(self) -> None:
        self.token = secrets.token_hex(16).encode()
        if not await self.owner.client.set(self.key, self.token, nx=True, px=int(TTL * 1000)):
            raise RuntimeError("the raw floor only runs uncontended")

    async def release(self) -> None:
        await self.owner.release_script(keys=[self.key], args=[self.token])


class RedisPyClient(AsyncClient):
    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    async def open(self, url: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(url)
        await self.client.ping()

    def handle(self, name: str) -> AsyncHandle:
        return _AcquireRelease(self.client.lock(f"redispy:{name}", timeout=TTL, sleep=self.sleep))

    async def close(self) -> None:
        await self.client.aclose()


class _AcquireRelease:
    """A peer lock object whose own ``acquire()``/``release()`` fit as they are."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    async def acquire(self) -> None:
        if not await self.lock.acquire():
            raise RuntimeError("acquire returned False")

    async def release(self) -> None:
        await self.lock.release()


class PotteryClient(AsyncClient):
    async def open(self, url: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(url)
        await self.client.ping()

    def handle(self, name: str) -> AsyncHandle:
        from pottery import AIORedlock

        lock = AIORedlock(key=f"pottery:{name}", masters={self.client}, auto_release_time=TTL)
        return _AcquireRelease(lock)

    async def close(self) -> None:
        await self.client.aclose()


class RawZooKeeperClient(AsyncClient):
    """The floor: create one ephemeral node, delete it."""

    async def open(self, url: str) -> None:
        import aiozk

        self.client = aiozk.ZKClient(_zk_hosts(url), session_timeout=TTL)
        await self.client.start()
        await self.client.ensure_path("/raw")

    def handle(self, name: str) -> AsyncHandle:
        return _RawZkHandle(self.client, f"/raw/{name}-{secrets.token_hex(6)}")

    async def close(self) -> None:
        await self.client.close()


class _RawZkHandle:
    def __init__(self, client: Any, path: str) -> None:
        self.client = client
        self.path = path

    async def acquire(self) -> None:
        await self.client.create(self.path, ephemeral=True)

    async def release(self) -> None:
        await self.client.delete(self.path)


class AiozkClient(AsyncClient):
    async def open(self, url: str) -> None:
        import aiozk

        self.client = aiozk.ZKClient(_zk_hosts(url), session_timeout=TTL)
        await self.client.start()

    def handle(self, name: str) -> AsyncHandle:
        return _AiozkHandle(self.client.recipes.Lock(f"/aiozk/{name}"))

    async def close(self) -> None:
        await self.client.close()


class _AiozkHandle:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    async def acquire(self) -> None:
        await self.lock.acquire()

    async def release(self) -> None:
        await self.lock.release()


class RawPostgresClient(AsyncClient):
    """The floor: pg_advisory_lock + pg_advisory_unlock, one connection per worker (a lock's session)."""

    async def open(self, url: str) -> None:
        self.url = url
        self.conns: list[Any] = []

    def handle(self, name: str) -> AsyncHandle:
        return _RawPgHandle(self, int.from_bytes(name.encode()[:7].ljust(7, b"\0"), "big"))

    async def close(self) -> None:
        await asyncio.gather(*(conn.close() for conn in self.conns), return_exceptions=True)


class _RawPgHandle:
    def __init__(self, owner: RawPostgresClient, key: int) -> None:
        self.owner = owner
        self.key = key
        self.conn: Any = None

    async def acquire(self) -> None:
        if self.conn is None:
            import asyncpg

            self.conn = await asyncpg.connect(self.owner.url)
            self.owner.conns.append(self.conn)
        await self.conn.execute("SELECT pg_advisory_lock($1)", self.key)

    async def release(self) -> None:
        await self.conn.execute("SELECT pg_advisory_unlock($1)", self.key)


class RawMySQLClient(AsyncClient):
    """The floor: GET_LOCK + RELEASE_LOCK, one connection per worker (a lock's session); with
    ``token``, the GET_LOCK of asynclock's statement, which takes the fencing token in the same
    statement (an InnoDB row, committed)."""

    def __init__(self, token: bool = False) -> None:
        self.token = token

    async def open(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.connect_args = {
            "host": parts.hostname,
            "port": parts.port or 3306,
            "user": parts.username or "root",
            "password": parts.password or "",
            "database": parts.path.lstrip("/"),
            "autocommit": True,
        }
        self.conns: list[Any] = []
        self.statement = "SELECT GET_LOCK(%s, 60)"
        if self.token:
            import asyncmy

            from asynclock.backends.mysql._sql import CREATE, TAKE

            conn = await asyncmy.connect(**self.connect_args)
            try:
                await conn.cursor().execute(CREATE.replace("{table}", "raw_fence"))
            finally:
                conn.close()
            self.statement = TAKE.replace("{table}", "raw_fence")

    def handle(self, name: str) -> AsyncHandle:
        return _RawMySQLHandle(self, f"raw:{name}")

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()


class _RawMySQLHandle:
    def __init__(self, owner: RawMySQLClient, key: str) -> None:
        self.owner = owner
        self.key = key
        self.cursor: Any = None

    async def acquire(self) -> None:
        if self.cursor is None:
            import asyncmy

            conn = await asyncmy.connect(**self.owner.connect_args)
            self.owner.conns.append(conn)
            self.cursor = conn.cursor()
        if self.owner.token:
            key = self.key
            if not await self.cursor.execute(self.owner.statement, (key, key, "raw", key, 60, "raw")):
                raise RuntimeError("GET_LOCK did not take the lock")
            return
        await self.cursor.execute(self.owner.statement, (self.key,))
        ((got,),) = await self.cursor.fetchall()
        if got != 1:
            raise RuntimeError(f"GET_LOCK returned {got!r}")

    async def release(self) -> None:
        await self.cursor.execute("SELECT RELEASE_LOCK(%s)", (self.key,))
        await self.cursor.fetchall()


class RawEtcdClient(AsyncClient):
    """The floor: one Put of a key attached to a lease to take, one Delete to give back.

    The requests are asynclock's hand-written protobuf bytes (etcd's own
    messages), sent on a plain grpc.aio channel: no lock recipe, no checks.
    """

    async def open(self, url: str) -> None:
        import grpc.aio

        from asynclock.backends.etcd import _replies, _wire

        self.wire = _wire
        self.channel = grpc.aio.insecure_channel(url.split("://", 1)[1].split("/", 1)[0])
        self.put = self.channel.unary_unary("/etcdserverpb.KV/Put")
        self.delete = self.channel.unary_unary("/etcdserverpb.KV/DeleteRange")
        grant = self.channel.unary_unary("/etcdserverpb.Lease/LeaseGrant")
        # Never kept alive, so granted for the whole run (revoked by close): the
        # floor measures a Put and a Delete, not keeping a lease.
        answer = _replies.LeaseResult.parse(await grant(_wire.lease_grant_request(3600), timeout=30))
        self.lease = answer.lease_id
        self.requests = 1

    def handle(self, name: str) -> AsyncHandle:
        return _RawEtcdHandle(self, f"raw/{name}/{secrets.token_hex(6)}".encode())

    async def close(self) -> None:
        revoke = self.channel.unary_unary("/etcdserverpb.Lease/LeaseRevoke")
        await revoke(self.wire.lease_id_request(self.lease), timeout=5)
        await self.channel.close()

    def round_trips(self) -> int | None:
        return self.requests


class _RawEtcdHandle:
    def __init__(self, owner: RawEtcdClient, key: bytes) -> None:
        self.owner = owner
        self.put = owner.wire.put_request(key, lease=owner.lease)
        self.delete = owner.wire.delete_request(key)

    async def acquire(self) -> None:
        self.owner.requests += 1
        await self.owner.put(self.put, timeout=TTL)

    async def release(self) -> None:
        self.owner.requests += 1
        await self.owner.delete(self.delete, timeout=TTL)


# -- thread clients -----------------------------------------------------------


class ThreadClient:
    def open(self, url: str) -> None:
        raise NotImplementedError

    def handle(self, name: str) -> SyncHandle:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class PythonRedisLockClient(ThreadClient):
    def open(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.client.ping()

    def handle(self, name: str) -> SyncHandle:
        import redis_lock  # type: ignore[import-untyped]

        return _SyncAcquireRelease(redis_lock.Lock(self.client, f"prl:{name}", expire=int(TTL)))

    def close(self) -> None:
        self.client.close()


class _SyncAcquireRelease:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self) -> None:
        if not self.lock.acquire():
            raise RuntimeError("acquire returned False")

    def release(self) -> None:
        self.lock.release()


class KazooClient(ThreadClient):
    def open(self, url: str) -> None:
        from kazoo.client import KazooClient as Kazoo

        self.client = Kazoo(hosts=_zk_hosts(url), timeout=TTL)
        self.client.start(timeout=30)

    def handle(self, name: str) -> SyncHandle:
        return _SyncAcquireRelease(self.client.Lock(f"/kazoo/{name}"))

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def _zk_hosts(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def async_client(key: str) -> AsyncClient:
    if key.startswith("asynclock-"):
        return AsynclockClient(fair=key.endswith("-fair"))
    if key.startswith("before-"):
        return AsynclockClient(module="asynclock_before")
    factories: dict[str, Any] = {
        "raw-redis": RawRedisClient,
        "redis-py-0.1": lambda: RedisPyClient(0.1),
        "redis-py-0.001": lambda: RedisPyClient(0.001),
        "pottery": PotteryClient,
        "raw-zookeeper": RawZooKeeperClient,
        "aiozk": AiozkClient,
        "raw-postgres": RawPostgresClient,
        "raw-mysql": RawMySQLClient,
        "raw-mysql-token": lambda: RawMySQLClient(token=True),
        "raw-etcd": RawEtcdClient,
    }
    client: AsyncClient = factories[key]()
    return client


def thread_client(key: str) -> ThreadClient:
    factories: dict[str, Any] = {"python-redis-lock": PythonRedisLockClient, "kazoo": KazooClient}
    client: ThreadClient = factories[key]()
    return client
