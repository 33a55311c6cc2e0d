"""redis-server on a free loopback port (and a unix socket), empty, no persistence.

The command line of an empty, non-persistent server and the PING readiness
probe are the ones ``asynclock demo`` starts its throwaway server with; this
adds loopback TCP, TLS and the life cycle of :class:`ServerProcess`.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
from collections.abc import Sequence
from pathlib import Path

from asynclock._demo._server import answers_ping, redis_server_binary, redis_server_command

from .base import ServerProcess, free_port

__all__ = ["RedisServer", "authenticated", "redis_server_binary"]


def authenticated(sock: socket.socket, password: str | None) -> bool:
    """Log the connected ``sock`` in with ``password`` (nothing to do without one); whether it was accepted."""
    if password is None:
        return True
    sock.sendall(f"AUTH {password}\r\n".encode())
    return sock.recv(64).startswith(b"+OK")


class RedisServer(ServerProcess):
    name = "redis"

    def __init__(
        self,
        port: int | None = None,
        workdir: Path | None = None,
        extra: Sequence[str] = (),
        tls: bool = False,
        password: str | None = None,
    ) -> None:
        super().__init__(workdir)
        self.tls = tls
        #: the password it wants (``requirepass``), or None; its URLs do not carry it
        self.password = password
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
            tcp = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.workdir / "server.crt"),
                "--tls-key-file", str(self.workdir / "server.key"),
                "--tls-ca-cert-file", str(self.workdir / "ca.crt"),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        else:
            tcp = ["--port", str(self.port)]
        listen = ["--bind", "127.0.0.1", *tcp, "--protected-mode", "no"]
        return [
            *redis_server_command(self.binary, self.workdir, listen=listen, unix_socket=self.socket_path),
            *(["--requirepass", self.password] if self.password is not None else []),
            *self.extra,
        ]

    def is_ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
            if not self.tls:
                return authenticated(raw, self.password) and answers_ping(raw)
            context = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                return authenticated(sock, self.password) and answers_ping(sock)

    def restart_empty(self) -> None:
        """Kill it and start it again on the same port with no data (a crash without persistence)."""
        self.kill()
        for leftover in ("dump.rdb", "appendonly.aof"):
            (self.workdir / leftover).unlink(missing_ok=True)
        self.start()
