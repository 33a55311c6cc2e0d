"""Several redis-servers working together: N independent primaries (Redlock),
a primary with a replica watched by sentinels, and a small Redis Cluster.

Every process is ours, on a free loopback port, in its own temp dir.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .base import ServerProcess, free_port
from .redis import RedisServer, authenticated


def _ask(port: int, *command: str, timeout: float = 1.0) -> str:
    """Send one command to 127.0.0.1:port with redis-cli and return its raw answer."""
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *command],
        capture_output=True,
        text=True,
        timeout=timeout + 5,
        check=False,
    )
    return done.stdout.strip()


class RedisNodes:
    """``count`` independent redis-servers: the nodes of a Redlock."""

    def __init__(self, count: int = 5) -> None:
        self.servers = [RedisServer() for _ in range(count)]

    def start(self) -> None:
        for server in self.servers:
            server.start()

    @property
    def url(self) -> str:
        return "redlock://" + ",".join(f"127.0.0.1:{server.port}" for server in self.servers)

    def __getitem__(self, index: int) -> RedisServer:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)

    def revive(self) -> None:
        """Every node running and answering again (after a test killed or paused some)."""
        for server in self.servers:
            server.resume()
            if not server.running:
                server.start()

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()


class SentinelServer(ServerProcess):
    """One redis-sentinel watching ``master`` at 127.0.0.1:``primary_port``.

    ``down_after_ms`` stays above the sentinel's ping period (1 s): at or below
    it, a just-promoted primary is judged down before its first ping is
    answered, and the sentinels fail over again, to whatever replica there is
    (an old primary that came back empty), which loses every key.
    """

    name = "sentinel"

    def __init__(
        self,
        primary_port: int,
        master: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 1500,
        *,
        password: str | None = None,
        primary_password: str | None = None,
    ) -> None:
        """``password``: the one this sentinel wants of its clients (``requirepass``);
        ``primary_password``: the one it gives the primary and its replicas (``auth-pass``)."""
        super().__init__()
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-sentinel not found on PATH (tests/run.sh installs it)")
        self.binary = binary
        self.port = free_port()
        self.master = master
        self.password = password
        secrets = [f"requirepass {password}"] if password is not None else []
        if primary_password is not None:
            secrets.append(f"sentinel auth-pass {master} {primary_password}")
        self.config = self.workdir / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {self.port}",
                    "protected-mode no",
                    f"dir {self.workdir}",
                    f"sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}",
                    f"sentinel down-after-milliseconds {master} {down_after_ms}",
                    f"sentinel failover-timeout {master} 2000",
                    f"sentinel parallel-syncs {master} 1",
                    *secrets,
                    "",
                ]
            )
        )

    def command(self) -> Sequence[str]:
        if self.binary.endswith("redis-sentinel"):
            return [self.binary, str(self.config)]
        return [self.binary, str(self.config), "--sentinel"]

    def is_ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
            if not authenticated(sock, self.password):
                return False
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")

    def primary_port(self) -> int | None:
        """The primary's port as this sentinel sees it now."""
        answer = _ask(self.port, "SENTINEL", "get-master-addr-by-name", self.master).split()
        return int(answer[1]) if len(answer) == 2 else None


class SentinelSetup:
    """A primary, one replica, and three sentinels with short failure timeouts."""

    master = "mymaster"

    def __init__(self, sentinels: int = 3) -> None:
        quick_sync = ["--repl-diskless-sync-delay", "0"]
        self.primary = RedisServer(extra=quick_sync)
        # writable, so that a test can make a write "not reach" the replica
        self.replica = RedisServer(
            extra=[*quick_sync, "--replicaof", "127.0.0.1", str(self.primary.port), "--replica-read-only", "no"]
        )
        self.sentinels: list[SentinelServer] = []
        self._count = sentinels

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        self.wait_replica_synced(self.replica)
        self.sentinels = [SentinelServer(self.primary.port, self.master) for _ in range(self._count)]
        for sentinel in self.sentinels:
            sentinel.start()
        # every sentinel knows the others and the replica before a test relies on a failover
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(self._sees_everyone(sentinel) for sentinel in self.sentinels):
                return
            time.sleep(0.1)
        raise RuntimeError("sentinels did not discover each other in time")

    def _sees_everyone(self, sentinel: SentinelServer) -> bool:
        answer = _ask(sentinel.port, "SENTINEL", "master", self.master).split("\n")
        fields = dict(zip(answer[::2], answer[1::2], strict=False))
        return int(fields.get("num-other-sentinels", 0)) >= self._count - 1 and int(fields.get("num-slaves", 0)) >= 1

    def wait_replica_synced(self, replica: RedisServer, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "master_link_status:up" in _ask(replica.port, "INFO", "replication"):
                return
            time.sleep(0.05)
        raise RuntimeError("the replica did not sync with its primary")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master}"

    def current_primary_port(self) -> int | None:
        for sentinel in self.sentinels:
            if sentinel.running:
                port = sentinel.primary_port()
                if port is not None:
                    return port
        return None

    def server_on(self, port: int) -> RedisServer:
        return self.primary if self.primary.port == port else self.replica

    def wait_sentinels_agree(self, port: int, timeout: float = 15) -> None:
        """Wait until every running sentinel names ``port`` as the primary.

        Bring an old primary back only then: a sentinel that has not heard of
        the failover yet sees "its" primary report itself a replica and turns
        it back into a primary, and two primaries serve clients at once.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(sentinel.primary_port() == port for sentinel in self.sentinels if sentinel.running):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the sentinels did not all name 127.0.0.1:{port} as the primary in time")

    def wait_failover(self, old_port: int, timeout: float = 30) -> int:
        """Wait until the sentinels name a new primary and it accepts writes; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.current_primary_port()
            if port is not None and port != old_port and "role:master" in _ask(port, "INFO", "replication"):
                return port
            time.sleep(0.05)
        raise RuntimeError("no failover within the time limit")

    def cleanup(self) -> None:
        for sentinel in self.sentinels:
            sentinel.cleanup()
        self.replica.cleanup()
        self.primary.cleanup()


class ClusterSetup:
    """A Redis Cluster of ``primaries`` nodes, no replicas, all slots covered."""

    def __init__(self, primaries: int = 3) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="asynclock-cluster-"))
        self.servers: list[RedisServer] = []
        for index in range(primaries):
            workdir = self.workdir / f"node{index}"
            workdir.mkdir()
            extra = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / "nodes.conf"),
                "--cluster-node-timeout", "2000",
                "--cluster-port", str(free_port()),  # the default, port + 10000, may not exist
                "--cluster-require-full-coverage", "no",
            ]  # fmt: skip
            self.servers.append(RedisServer(workdir=workdir, extra=extra))

    def start(self) -> None:
        for server in self.servers:
            server.start()
        addresses = [f"127.0.0.1:{server.port}" for server in self.servers]
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in _ask(server.port, "CLUSTER", "INFO") for server in self.servers):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{server.port}" for server in self.servers)

    def node_id(self, server: RedisServer) -> str:
        return _ask(server.port, "CLUSTER", "MYID")

    def owner_of(self, slot: int) -> RedisServer:
        """The node that serves ``slot`` now, as the first node sees it."""
        for line in _ask(self.servers[0].port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            for part in fields[8:]:
                low, _, high = part.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return next(server for server in self.servers if server.port == port)
        raise RuntimeError(f"no node serves slot {slot}")

    def move_slot(self, slot: int, target: RedisServer) -> RedisServer:
        """Migrate ``slot`` (with its keys) to ``target``, as a resharding does; the old owner."""
        source = self.owner_of(slot)
        assert source is not target, "the slot is already there"
        source_id, target_id = self.node_id(source), self.node_id(target)
        _ask(target.port, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
        _ask(source.port, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
        while True:
            keys = _ask(source.port, "CLUSTER", "GETKEYSINSLOT", str(slot), "100").split()
            if not keys:
                break
            answer = _ask(source.port, "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys)
            if answer != "OK":
                raise RuntimeError(f"MIGRATE failed: {answer}")
        for server in [target, source, *[s for s in self.servers if s not in (source, target)]]:
            _ask(server.port, "CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        return source

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
