"""redis-server on a free loopback port (and a unix socket), empty, no persistence."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from .base import ServerProcess, free_port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer(ServerProcess):
    name = "redis"

    def __init__(self, port: int | None = None, workdir: Path | None = None, extra: Sequence[str] = ()) -> None:
        super().__init__(workdir)
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
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}"

    def command(self) -> Sequence[str]:
        return [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--unixsocket", str(self.socket_path),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--protected-mode", "no",
            *self.extra,
        ]  # fmt: skip

    def is_ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")

    def restart_empty(self) -> None:
        """Kill it and start it again on the same port with no data (a crash without persistence)."""
        self.kill()
        for leftover in ("dump.rdb", "appendonly.aof"):
            (self.workdir / leftover).unlink(missing_ok=True)
        self.start()
