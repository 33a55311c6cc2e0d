"""A throwaway redis-server: it starts empty, never writes its data to disk, and lives in a temp dir.

``asynclock demo`` runs one when it is given no ``--url``. The test suite's
Redis servers are started with the same command line and the same readiness
probe, so that what the demo runs and what the tests run cannot drift apart.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def redis_server_binary() -> str | None:
    """The ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def redis_server_command(
    binary: str, workdir: Path, *, listen: Sequence[str] = ("--port", "0"), unix_socket: Path | None = None
) -> list[str]:
    """The command line of a redis-server that starts empty and persists nothing.

    ``listen`` are the flags for TCP (the default, port 0, turns TCP off);
    ``unix_socket`` adds a socket that only this user may connect to. Flags
    appended to the list override these.
    """
    command = [binary, *listen]
    if unix_socket is not None:
        command += ["--unixsocket", str(unix_socket), "--unixsocketperm", "700"]
    # No RDB snapshots and no AOF: a restart comes back with no data. Whatever it
    # does write (a replica's sync file) goes to workdir, not to the caller's cwd.
    return [*command, "--save", "", "--appendonly", "no", "--dir", str(workdir)]


def answers_ping(sock: socket.socket) -> bool:
    """Whether the redis-server at the other end of the connected ``sock`` answers PING.

    A server that answers PING has loaded its (empty) data and serves commands.
    Raises OSError when the connection fails or the socket's timeout runs out.
    """
    sock.sendall(b"PING\r\n")
    return sock.recv(64).startswith(b"+PONG")


class EmbeddedRedis:
    """A throwaway redis-server on a unix socket in a temp dir, stopped by its pid."""

    def __init__(self, binary: str) -> None:
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="asynclock-demo-"))
        self.socket_path = self._dir / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = redis_server_command(self._binary, self._dir, unix_socket=self.socket_path)
        with open(self._dir / "redis.log", "wb") as log:
            # Its own session: a Ctrl-C in the terminal reaches us, and we stop it.
            return subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    async def start(self, timeout: float = 15.0) -> None:
        self._proc = self._spawn()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self._dir / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server did not start:\n{log_text}")
            await asyncio.sleep(0.02)

    def _ready(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(str(self.socket_path))
                return answers_ping(sock)
        except OSError:
            return False

    def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)
