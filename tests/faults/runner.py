"""Targets (the lock service under test) and Run (a set of worker processes).

A target knows how to reach the service (directly or through a per-worker
``TcpProxy``), which faults it can inject (only a server we started can be
frozen or killed), and how to list what a run left on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis

from tests.faults.checker import StaleWindow, Verdict, WorkerLog, check
from tests.faults.store import FencedStore
from tests.faults.worker import WorkerConfig
from tests.servers.base import ServerProcess
from tests.servers.proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]


class Target:
    """The lock service under test."""

    kind = "?"
    #: how long a dead holder keeps the lock at most, as a multiple of the ttl
    lease_factor = 1.0
    #: whether its leases carry fencing tokens
    tokens = True

    def __init__(self, url: str, server: ServerProcess | None = None) -> None:
        self.url = url
        self.server = server
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        try:
            self.port = parts.port or 0
        except ValueError:  # several hosts (zk://a:1,b:2): no single port to proxy
            self.port = 0

    @property
    def can_proxy(self) -> bool:
        return self.host in ("127.0.0.1", "localhost") and self.port != 0 and "," not in urlsplit(self.url).netloc

    def via(self, proxy: TcpProxy) -> str:
        parts = urlsplit(self.url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{proxy.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        """Holds or queue entries of a run (its ``prefix``, its ``clients``) still on the server."""
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def redis_leftovers(admin: aioredis.Redis, prefix: str) -> list[str]:
    """What is still held or queued under ``prefix``: every key but what released locks keep of
    their fencing tokens (a ``:fence`` counter, a plain lock's ``:x`` or an election's ``:e``
    holding only its last token)."""
    left = []
    async for key in admin.scan_iter(match=f"{prefix}:*"):
        if key.endswith(b":fence"):
            continue
        if key.endswith((b":x", b":e")):
            value = await admin.get(key)
            if value is not None and b" " not in value:
                continue
        left.append(key.decode())
    return left


class RedisTarget(Target):
    kind = "redis"

    def __init__(self, url: str, server: ServerProcess | None = None) -> None:
        super().__init__(url, server)
        self.admin = aioredis.Redis.from_url(url)

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        return await redis_leftovers(self.admin, prefix)

    async def pubsub_clients(self) -> int:
        return len(await self.admin.client_list(_type="pubsub"))

    async def kill_pubsub(self) -> int:
        return int(await self.admin.client_kill_filter(_type="pubsub"))

    async def flush_scripts(self) -> None:
        await self.admin.script_flush()

    async def reconnect_admin(self) -> None:
        with contextlib.suppress(Exception):
            await self.admin.aclose()
        self.admin = aioredis.Redis.from_url(self.url)

    async def aclose(self) -> None:
        await self.admin.aclose()


class ZooKeeperTarget(Target):
    kind = "zookeeper"

    def __init__(self, url: str, server: ServerProcess | None = None, ensemble: Any = None) -> None:
        super().__init__(url, server)
        #: a ZooKeeperEnsemble we started (its leader can be killed or frozen)
        self.ensemble = ensemble

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        from asynclock.abc import LockRef
        from asynclock.backends.zookeeper import ZooKeeperBackend
        from tests.harnesses.zookeeper import AdminClient

        hosts = urlsplit(self.url).netloc
        # (the backend object only computes the key: no I/O)
        base = ZooKeeperBackend([("127.0.0.1", 1)], prefix=prefix).lock_key(LockRef("lock", "x")).rsplit("/", 1)[0]
        chroot = urlsplit(self.url).path.rstrip("/")
        base = f"{chroot}{base}"  # the admin client has no chroot
        admin = await AdminClient(hosts).start()
        try:
            found = []
            for child in await admin.children(base):
                found += await admin.contenders(f"{base}/{child}")
            return found
        finally:
            await admin.close()


class EtcdTarget(Target):
    kind = "etcd"
    #: etcd counts a lease's TTL in whole seconds (at least one): a dead client's keys
    #: last up to that, for the short ttls of these runs up to twice the ttl
    lease_factor = 2.0

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        from tests.harnesses.etcd import AdminClient

        admin = AdminClient(urlsplit(self.url).netloc.rsplit("@", 1)[-1])
        try:
            return [kv.key.decode(errors="replace") for kv in await admin.keys(f"{prefix}/")]
        finally:
            await admin.close()


class PostgresTarget(Target):
    kind = "postgres"

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        import asyncpg

        from tests.harnesses.postgres import HELD_SQL

        conn = await asyncpg.connect(self.url)
        try:
            rows = await conn.fetch(HELD_SQL)
        finally:
            await conn.close()
        return [
            f"({row['classid']},{row['objid']}) pid {row['pid']} ({row['app']})"
            for row in rows
            if any(client in (row["app"] or "") for client in clients)
        ]


class MySQLTarget(Target):
    """MySQL or MariaDB; its sessions can be ended with ``KILL`` (:meth:`kill_holder`)."""

    kind = "mysql"
    #: the server ends a dead client's session after its wait_timeout, in whole seconds (at
    #: least one): for the short ttls of these runs up to twice the ttl
    lease_factor = 2.0

    async def _admin(self) -> Any:
        import asyncmy

        parts = urlsplit(self.url)
        return await asyncmy.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=parts.path.lstrip("/"),
            autocommit=True,
        )

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        """Keys of the run's fence table still held by a session (locks, elections, semaphore slots)."""
        conn = await self._admin()
        try:
            cursor = conn.cursor()
            await cursor.execute(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                (f"{prefix}_fence",),
            )
            if not (await cursor.fetchone())[0]:
                return []
            await cursor.execute(f"SELECT k, IS_USED_LOCK(k) FROM `{prefix}_fence`")
            return [f"{key} held by connection {holder}" for key, holder in await cursor.fetchall() if holder]
        finally:
            conn.close()

    async def kill_holder(self, prefix: str, name: str, workload: str) -> bool:
        """End the session holding the run's lock (or its election) with ``KILL``; whether one did."""
        from asynclock.backends.mysql import election_key, lock_key

        key = election_key(prefix, name) if workload == "election" else lock_key(prefix, name)
        conn = await self._admin()
        try:
            cursor = conn.cursor()
            await cursor.execute("SELECT IS_USED_LOCK(%s)", (key,))
            (holder,) = await cursor.fetchone()
            if holder is None:
                return False
            await cursor.execute("KILL %s", (holder,))
            return True
        finally:
            conn.close()


class RedlockTarget(Target):
    """``redlock://`` over independent redis-servers; ``nodes`` when we started them
    (then a minority or a majority of them can be killed)."""

    kind = "redlock"
    tokens = False

    def __init__(self, url: str, nodes: Any = None) -> None:
        super().__init__(url, None)
        #: a RedisNodes we started
        self.nodes = nodes

    def _admins(self) -> list[tuple[str, aioredis.Redis]]:
        netloc = urlsplit(self.url).netloc.rsplit("@", 1)[-1]
        return [(host, aioredis.Redis.from_url(f"redis://{host}/0")) for host in netloc.split(",")]

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        found = []
        for host, admin in self._admins():
            try:
                keys = [k.decode() async for k in admin.scan_iter(match=f"{prefix}:*")]
                found += [f"{host} {key}" for key in keys if not key.endswith(":fence")]
            except (OSError, aioredis.ConnectionError):
                pass  # a node that is down holds nothing we could see
            finally:
                await admin.aclose()
        return found


class SentinelTarget(Target):
    """``redis+sentinel://`` over a SentinelSetup we started (its primary can be killed)."""

    kind = "sentinel"

    def __init__(self, url: str, setup: Any = None) -> None:
        super().__init__(url, None)
        #: a SentinelSetup we started
        self.setup = setup

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        port = await asyncio.get_running_loop().run_in_executor(None, self.setup.current_primary_port)
        admin = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
        try:
            return await redis_leftovers(admin, prefix)
        finally:
            await admin.aclose()


class MemoryTarget(Target):
    """``memory://`` in separate processes: every worker has its own lock table, so
    this is a broken lock on purpose (the checker must catch it)."""

    kind = "memory"

    async def leftovers(self, prefix: str, clients: list[str]) -> list[str]:
        return []


def target_for(url: str, server: ServerProcess | None = None) -> Target:
    scheme = url.split("://", 1)[0]
    if scheme == "memory":
        return MemoryTarget(url, server)
    if scheme in ("redis", "rediss", "unix"):
        return RedisTarget(url, server)
    if scheme == "redlock":
        return RedlockTarget(url)
    if scheme == "redis+sentinel":
        return SentinelTarget(url)
    if scheme == "zk":
        return ZooKeeperTarget(url, server)
    if scheme in ("postgresql", "postgres"):
        return PostgresTarget(url, server)
    if scheme in ("etcd", "etcds"):
        return EtcdTarget(url, server)
    if scheme in ("mysql", "mariadb"):
        return MySQLTarget(url, server)
    raise ValueError(f"no fault target for {url!r}")


class Worker:
    """One worker process of a run (started, and only ever signalled, by us)."""

    def __init__(self, index: int, config: WorkerConfig, proxy: TcpProxy | None) -> None:
        self.index = index
        self.config = config
        self.proxy = proxy
        self.journal = Path(config.out)
        self._stderr = open(self.journal.with_suffix(".stderr"), "wb")  # noqa: SIM115 - closed in reap()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.worker", config.to_json()],
            stdin=subprocess.PIPE,
            stdout=self._stderr,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
        self.log = WorkerLog(index)
        self._offset = 0
        self._partial = b""
        self.killed_at: float | None = None
        self.frozen = False

    def poll(self) -> WorkerLog:
        """Read what the worker wrote since the last poll."""
        try:
            with open(self.journal, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return self.log
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            with contextlib.suppress(ValueError):
                self.log.add(json.loads(line))
        return self.log

    def send(self, word: str) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.proc.stdin.write(f"{word}\n".encode())
                self.proc.stdin.flush()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def holding(self, min_hold: float = 0.0) -> int | None:
        """The section this worker is in (its sid), if any, planned to last ``min_hold`` or more."""
        log = self.poll()
        for sid in log.open_starts:
            if sid not in log.ended and log.planned.get(sid, 0.0) >= min_hold:
                return sid
        return None

    def kill(self) -> float:
        self.thaw()
        self.proc.send_signal(signal.SIGKILL)
        # A process runs no more of its own code once SIGKILL is sent (the
        # server may see its connections close before we reap it).
        self.killed_at = time.monotonic()
        self.proc.wait(timeout=10)
        return self.killed_at

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def reap(self, timeout: float) -> bool:
        """Wait for a clean exit; SIGKILL after ``timeout``. True if it exited by itself."""
        self.thaw()
        self.send("stop")
        try:
            self.proc.wait(timeout=timeout)
            clean = True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            clean = False
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self._stderr.close()
        return clean

    def output(self, tail: int = 3000) -> str:
        try:
            return self.journal.with_suffix(".stderr").read_text(errors="replace")[-tail:]
        except OSError:
            return ""


class Run:
    """Worker processes contending for one lock, plus the bookkeeping to check them.

    ``defaults`` are WorkerConfig fields shared by every worker; ``proxied``
    puts a TcpProxy of its own between each worker and the server.
    """

    def __init__(
        self, target: Target, store_url: str, workdir: Path, *, proxied: bool = False, **defaults: Any
    ) -> None:
        self.target = target
        self.store_url = store_url
        self.workdir = workdir
        self.proxied = proxied
        tag = secrets.token_hex(3)
        self.prefix = f"f{tag}"
        self.store_prefix = f"store-{tag}"
        self.defaults = defaults
        self.workers: list[Worker] = []
        self.stale: list[StaleWindow] = []
        self.faults = 0
        self.notes: list[str] = []
        self.extra_violations: list[str] = []
        #: (worker, sid) of sections that a fault must have ended with LockLost
        self.expect_lost: list[tuple[int, int]] = []
        self._seed = int(tag, 16)

    # -- workers ----------------------------------------------------------------

    def spawn(self, **overrides: Any) -> Worker:
        index = len(self.workers)
        proxy = None
        url = self.target.url
        if self.proxied:
            proxy = TcpProxy("127.0.0.1", self.target.port).start()
            url = self.target.via(proxy)
        options = {**self.defaults, **overrides}
        config = WorkerConfig(
            url=url,
            store_url=self.store_url,
            store_prefix=self.store_prefix,
            out=str(self.workdir / f"{self.prefix}-w{index}.jsonl"),
            prefix=self.prefix,
            seed=self._seed + index,
            tokens=self.target.tokens,
            **options,
        )
        worker = Worker(index, config, proxy)
        self.workers.append(worker)
        return worker

    async def ready(self, workers: list[Worker], timeout: float = 60.0) -> None:
        """Wait until every one of ``workers`` is connected, then let them go."""
        deadline = time.monotonic() + timeout
        for worker in workers:
            while worker.poll().client is None:
                if not worker.alive:
                    raise RuntimeError(f"worker {worker.index} exited before ready:\n{worker.output()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {worker.index} not ready in {timeout}s:\n{worker.output()}")
                await asyncio.sleep(0.02)
        for worker in workers:
            worker.send("go")

    async def start(self, count: int, **overrides: Any) -> list[Worker]:
        workers = [self.spawn(**overrides) for _ in range(count)]
        await self.ready(workers)
        return workers

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive and w.killed_at is None]

    async def holder(self, timeout: float, min_hold: float = 0.0, *, must_lose: bool = True) -> Worker | None:
        """A live worker inside its critical section right now (None if none shows up in time);
        with ``min_hold``, only one whose section is planned to last that long, and (with
        ``must_lose``) that the fault about to come must end by LockLost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for worker in self.live():
                sid = None if worker.frozen else worker.holding(min_hold)
                if sid is not None:
                    if min_hold and must_lose:
                        self.expect_lost.append((worker.index, sid))
                    return worker
            await asyncio.sleep(0.005)
        return None

    async def next_start(self, after: float, exclude: Worker | None, timeout: float) -> float | None:
        """Monotonic start of the first section (of another worker) that began after ``after``."""
        deadline = time.monotonic() + timeout
        while True:
            starts = []
            for worker in self.workers:
                if worker is exclude:
                    continue
                log = worker.poll()
                starts += [s.start for s in log.sections if s.start > after]
                starts += [t for t, _ in log.open_starts.values() if t > after]
            if starts:
                return min(starts)
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.01)

    # -- the end ------------------------------------------------------------------

    async def finish(self, timeout: float) -> Verdict:
        """Stop every worker, then check the journals, the store and the server."""
        loop = asyncio.get_running_loop()
        clean = await asyncio.gather(
            *(loop.run_in_executor(None, w.reap, timeout) for w in self.workers if w.killed_at is None)
        )
        for worker in self.workers:
            if worker.proxy is not None:
                worker.proxy.stop()
        logs = []
        killed = []
        for worker in self.workers:
            log = WorkerLog.read(worker.index, worker.journal)
            if worker.killed_at is not None:
                log.close_killed(worker.killed_at)
                killed.append(worker.index)
            logs.append(log)
        store = FencedStore(self.store_url, self.store_prefix)
        try:
            state = await store.state()
            await store.clear()
        finally:
            await store.aclose()
        verdict = check(logs, state, self.stale, killed=killed, tokens=self.target.tokens)
        if not all(clean):
            verdict.violations.append("a worker had to be killed at the end (stuck)")
        clients = [log.client for log in logs if log.client]
        if not killed:
            # every worker closed its client: nothing of this run may remain
            left = await self.target.leftovers(self.prefix, clients)
            if left:
                verdict.violations.append(f"left on the server after every client closed: {left}")
        verdict.violations += self.extra_violations
        outcomes = {(s.worker, s.sid): s.outcome for log in logs for s in log.sections}
        for worker_index, sid in self.expect_lost:
            got = outcomes.get((worker_index, sid))
            if got != "lost":
                verdict.violations.append(f"worker {worker_index} section {sid} ended {got!r}, not by LockLost")
        for worker in self.workers:
            printed = worker.output()
            if any("Traceback" in line for line in printed.splitlines()):
                # the exception's own line first: a long report is cut short where it is shown
                last = printed.strip().splitlines()[-1]
                verdict.violations.append(f"worker {worker.index} printed a traceback ending {last!r}:\n{printed}")
        return verdict

    def abort(self) -> None:
        """Kill everything left (after an error in the scenario itself)."""
        for worker in self.workers:
            if worker.alive:
                worker.thaw()
                worker.proc.kill()
                worker.proc.wait(timeout=10)
            if worker.proxy is not None:
                worker.proxy.stop()
