"""ZooKeeper from Debian's ``zookeeper`` package, run with ``java -cp`` on its jars.

``ZooKeeperServer`` is one process: standalone, or one member of a
``ZooKeeperEnsemble`` of three on loopback. Every port is a free loopback
port, the data lives in a temp dir, and the tick is short (100 ms) so session
tests run fast. The session timeout bounds are set explicitly (from 2 ticks
up to a minute) so a test can ask for what it needs.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base import ServerProcess, free_port

#: Milliseconds per ZooKeeper tick in the test servers.
TICK_MS = 100


def zookeeper_classpath() -> str | None:
    """The class path of Debian's ZooKeeper server (its jar names its dependencies)."""
    jars = sorted(glob.glob("/usr/share/java/zookeeper-3*.jar")) or glob.glob("/usr/share/java/zookeeper.jar")
    server = [jar for jar in jars if "contrib" not in jar and "-it" not in jar and "recipes" not in jar]
    if not server:
        return None
    extra = [
        found
        for name in ("zookeeper-jute", "slf4j-simple")
        for found in sorted(glob.glob(f"/usr/share/java/{name}.jar"))
    ]
    return os.pathsep.join([server[-1], *extra])


def java_binary() -> str | None:
    return shutil.which("java")


def four_letter(port: int, word: bytes, timeout: float = 1.0) -> bytes:
    """Send a four-letter command (``ruok``, ``srvr``, ``mntr``) and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(word)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


class ZooKeeperServer(ServerProcess):
    """One ZooKeeper server process (standalone unless ``peers`` are given)."""

    name = "zookeeper"

    def __init__(
        self,
        *,
        port: int | None = None,
        myid: int | None = None,
        peers: dict[int, tuple[int, int]] | None = None,
        workdir: Path | None = None,
        tick_ms: int = TICK_MS,
    ) -> None:
        super().__init__(workdir)
        classpath = zookeeper_classpath()
        java = java_binary()
        if classpath is None or java is None:
            raise RuntimeError("ZooKeeper or java not found (tests/run.sh installs the zookeeper package and a JRE)")
        self.classpath = classpath
        self.java = java
        self.port = port or free_port()
        self.myid = myid
        self.peers = peers or {}
        self.tick_ms = tick_ms
        self.data_dir = self.workdir / "data"
        self.config_path = self.workdir / "zoo.cfg"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"zk://{self.hostport}"

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=20",
            "syncLimit=5",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0",
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,mntr,stat,cons,wchp,wchc",
            "autopurge.purgeInterval=0",
            "reconfigEnabled=false",
            # empty lock directories (container nodes) are removed quickly
            "znode.container.checkIntervalMs=1000",
        ]
        if self.peers:
            assert self.myid is not None
            (self.data_dir / "myid").write_text(f"{self.myid}\n")
            lines.append("standaloneEnabled=false")
            lines += [f"server.{sid}=127.0.0.1:{quorum}:{election}" for sid, (quorum, election) in self.peers.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def command(self) -> Sequence[str]:
        self.write_config()
        return [
            self.java,
            "-Xms32m",
            "-Xmx192m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.forceSync=no",
            "-Dzookeeper.admin.enableServer=false",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            self.classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.config_path),
        ]

    def is_ready(self) -> bool:
        return self.mode() is not None

    def restart(self, *, crash: bool = True, timeout: float = 60.0) -> None:
        """SIGKILL (``crash``) or SIGTERM it, then start it again on the same ports and data
        directory: sessions and ephemeral nodes come back from its snapshot and log."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start(timeout)

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower`` once it serves clients, else None."""
        try:
            answer = four_letter(self.port, b"srvr", timeout=0.5)
        except OSError:
            return None
        for line in answer.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class ZooKeeperEnsemble:
    """Three ZooKeeper servers on loopback forming one quorum."""

    def __init__(self, size: int = 3, tick_ms: int = TICK_MS) -> None:
        peers = {sid: (free_port(), free_port()) for sid in range(1, size + 1)}
        self.servers = {sid: ZooKeeperServer(myid=sid, peers=peers, tick_ms=tick_ms) for sid in range(1, size + 1)}

    @property
    def hosts(self) -> str:
        return ",".join(server.hostport for server in self.servers.values())

    @property
    def url(self) -> str:
        return f"zk://{self.hosts}"

    def start(self, timeout: float = 60.0) -> None:
        # None of them is ready before a quorum runs: start them side by side.
        with ThreadPoolExecutor(len(self.servers)) as pool:
            for future in [pool.submit(server.start, timeout) for server in self.servers.values()]:
                future.result()

    def leader(self, timeout: float = 30.0) -> ZooKeeperServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for server in self.servers.values():
                if server.running and not server._paused and server.mode() == "leader":
                    return server
            time.sleep(0.05)
        raise RuntimeError("no leader elected in time")

    def wait_serving(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` servers serve clients (a quorum has a leader)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            serving = [s for s in self.servers.values() if s.running and not s._paused and s.mode()]
            if len(serving) >= count:
                return
            time.sleep(0.05)
        logs = "\n".join(s.log(1500) for s in self.servers.values())
        raise RuntimeError(f"fewer than {count} servers serving in time:\n{logs}")

    def cleanup(self) -> None:
        for server in self.servers.values():
            server.cleanup()
