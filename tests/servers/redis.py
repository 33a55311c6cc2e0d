"""redis-server on a free loopback port (and a unix socket), empty, no persistence."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .base import ServerProcess, free_port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer(ServerProcess):
    name = "redis"

    def __init__(
        self, port: int | None = None, workdir: Path | None = None, extra: Sequence[str] = (), tls: bool = False
    ) -> None:
        super().__init__(workdir)
        self.tls = tls
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server not found on PATH (tests/run.sh installs it)")
        self.binary = binary
        self.port = port or free_port()
        self.socket_path = self.workdir / "redis.sock"
        self.extra = list(extra)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.workdir / 'ca.crt'}"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}"

    def _make_certificates(self) -> None:
        """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
        d = self.workdir
        if (d / "server.crt").exists():
            return
        run = ["openssl"]
        subprocess.run(
            [*run, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=asynclock-test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            [*run, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", str(d / "server.key"), "-out", str(d / "server.csr")],
            check=True, capture_output=True,
        )  # fmt: skip
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        subprocess.run(
            [*run, "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "2", "-extfile", str(d / "san.ext"), "-out", str(d / "server.crt")],
            check=True, capture_output=True,
        )  # fmt: skip

    def command(self) -> Sequence[str]:
        if self.tls:
            self._make_certificates()
            listen = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.workdir / "server.crt"),
                "--tls-key-file", str(self.workdir / "server.key"),
                "--tls-ca-cert-file", str(self.workdir / "ca.crt"),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        else:
            listen = ["--port", str(self.port)]
        return [
            self.binary,
            "--bind", "127.0.0.1",
            *listen,
            "--unixsocket", str(self.socket_path),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--protected-mode", "no",
            *self.extra,
        ]  # fmt: skip

    def is_ready(self) -> bool:
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                    sock.sendall(b"PING\r\n")
                    return sock.recv(64).startswith(b"+PONG")
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")

    def restart_empty(self) -> None:
        """Kill it and start it again on the same port with no data (a crash without persistence)."""
        self.kill()
        for leftover in ("dump.rdb", "appendonly.aof"):
            (self.workdir / leftover).unlink(missing_ok=True)
        self.start()
