"""etcd from Debian's ``etcd-server`` package (``etcdctl`` from ``etcd-client``).

``EtcdServer`` is one process: a single-member cluster, or one member of an
``EtcdCluster`` of three on loopback. Every port is a free loopback port and
the data lives in a temp dir (in memory under /dev/shm when there is one:
etcd syncs its log on every write). Heartbeats and elections are short
(10 ms / 100 ms) so a failover takes a fraction of a second and the
smallest lease etcd grants is its one-second floor.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base import ServerProcess, free_port

#: Milliseconds between leader heartbeats, and before a follower calls an election.
HEARTBEAT_MS = 10
ELECTION_MS = 100


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def etcdctl_binary() -> str | None:
    return shutil.which("etcdctl")


def _scratch_dir(prefix: str) -> Path:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class EtcdServer(ServerProcess):
    """One etcd member (a cluster of its own unless ``cluster`` names its peers)."""

    name = "etcd"

    def __init__(
        self,
        *,
        member: str = "m1",
        client_port: int | None = None,
        peer_port: int | None = None,
        cluster: dict[str, int] | None = None,
        token: str | None = None,
        workdir: Path | None = None,
        extra: Sequence[str] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd not found (tests/run.sh installs the etcd-server package)")
        own = workdir is None
        super().__init__(_scratch_dir(f"asynclock-{self.name}-") if own else workdir)
        self._own_dir = own
        self.binary = binary
        self.member = member
        self.port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.cluster = cluster or {member: self.peer_port}
        self.token = token or f"asynclock-{os.getpid()}-{self.port}"
        self.data_dir = self.workdir / "data"
        self.extra = list(extra)
        #: serve clients over TLS with these certificates (``etcds://``)
        self.tls = tls

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.hostport}"

    @property
    def url(self) -> str:
        return f"{'etcds' if self.tls else 'etcd'}://{self.hostport}"

    def command(self) -> Sequence[str]:
        peers = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in self.cluster.items())
        state = "existing" if self.data_dir.exists() else "new"
        return [
            self.binary,
            f"--name={self.member}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
            f"--initial-cluster={peers}",
            f"--initial-cluster-state={state}",
            f"--initial-cluster-token={self.token}",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            "--listen-metrics-urls=",
            "--logger=zap",
            "--log-level=warn",
            *([f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}"] if self.tls is not None else []),
            *self.extra,
        ]

    def env(self) -> dict[str, str] | None:
        env = dict(os.environ)
        env.pop("ETCDCTL_API", None)
        env.pop("ETCD_UNSUPPORTED_ARCH", None)
        return env

    def health(self, timeout: float = 0.5) -> dict[str, object] | None:
        """The member's ``/health`` answer, or None when it does not answer."""
        context = ssl.create_default_context(cafile=str(self.tls.ca)) if self.tls is not None else None
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=timeout, context=context) as answer:
                return dict(json.loads(answer.read()))
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def is_ready(self) -> bool:
        health = self.health()
        if health is None:
            return False
        # a member of a cluster still forming answers /health with "false"
        return str(health.get("health")) == "true" or len(self.cluster) > 1

    def restart(self, *, crash: bool = True, timeout: float = 30.0) -> None:
        """SIGKILL (``crash``) or SIGTERM it, then start it again on the same ports and data."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start(timeout)

    def etcdctl(self, *args: str, timeout: float = 30.0, endpoints: str | None = None) -> str:
        """Run ``etcdctl`` against this member (or ``endpoints``) and return its output."""
        return etcdctl(endpoints or self.endpoint, *args, timeout=timeout)

    def leader(self, timeout: float = 2.0) -> bool | None:
        """Whether this member is the leader (None when it does not answer)."""
        try:
            out = self.etcdctl("endpoint", "status", "--write-out=json", timeout=timeout)
        except (subprocess.SubprocessError, OSError):
            return None
        status = json.loads(out)[0]["Status"]
        return bool(status["header"]["member_id"] == status["leader"])


class TlsFiles:
    """A CA and a server certificate for 127.0.0.1 made with ``openssl`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = directory / "ca.pem"
        self.cert = directory / "server.pem"
        self.key = directory / "server-key.pem"
        ca_key = directory / "ca-key.pem"
        request = directory / "server.csr"
        extensions = directory / "server.ext"
        extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=asynclock test CA",
                "-keyout", str(ca_key), "-out", str(self.ca))  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                "-keyout", str(self.key), "-out", str(request))  # fmt: skip
        openssl("x509", "-req", "-in", str(request), "-CA", str(self.ca), "-CAkey", str(ca_key),
                "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(self.cert))  # fmt: skip


def etcdctl(endpoints: str, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> str:
    """Run ``etcdctl --endpoints=…`` (v3 API) and return its standard output."""
    binary = etcdctl_binary()
    if binary is None:
        raise RuntimeError("etcdctl not found (tests/run.sh installs the etcd-client package)")
    full = {**os.environ, "ETCDCTL_API": "3", **(env or {})}
    done = subprocess.run(
        [binary, f"--endpoints={endpoints}", "--dial-timeout=2s", "--command-timeout=5s", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        check=False,
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


class EtcdCluster:
    """Three etcd members on loopback forming one cluster."""

    def __init__(self, size: int = 3) -> None:
        ports = {f"m{i}": free_port() for i in range(1, size + 1)}
        token = f"asynclock-cluster-{os.getpid()}-{next(iter(ports.values()))}"
        self.servers = {
            name: EtcdServer(member=name, peer_port=port, cluster=ports, token=token) for name, port in ports.items()
        }

    @property
    def hosts(self) -> str:
        return ",".join(server.hostport for server in self.servers.values())

    @property
    def endpoints(self) -> str:
        return ",".join(server.endpoint for server in self.servers.values())

    @property
    def url(self) -> str:
        return f"etcd://{self.hosts}"

    def start(self, timeout: float = 30.0) -> None:
        # None of them serves before a quorum runs: start them side by side.
        with ThreadPoolExecutor(len(self.servers)) as pool:
            for future in [pool.submit(server.start, timeout) for server in self.servers.values()]:
                future.result()
        self.wait_serving(len(self.servers), timeout)

    def leader(self, timeout: float = 30.0) -> EtcdServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for server in self.servers.values():
                if server.running and not server._paused and server.leader():
                    return server
            time.sleep(0.05)
        raise RuntimeError("no etcd leader elected in time")

    def wait_serving(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` members report themselves healthy (a leader is elected)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            healthy = [
                s
                for s in self.servers.values()
                if s.running and not s._paused and str((s.health() or {}).get("health")) == "true"
            ]
            if len(healthy) >= count:
                return
            time.sleep(0.05)
        logs = "\n".join(s.log(1500) for s in self.servers.values())
        raise RuntimeError(f"fewer than {count} etcd members healthy in time:\n{logs}")

    def cleanup(self) -> None:
        for server in self.servers.values():
            server.cleanup()
