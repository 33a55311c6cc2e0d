"""MariaDB from the distribution's packages (``mariadb-server``), installed into a temp dir.

``mariadb-install-db`` makes the data directory; ``mariadbd`` serves it on a
free loopback port and on a unix socket inside the temp dir (as root it runs
with ``--user=root``: the test files are root's). The tests connect as
``root`` over TCP from 127.0.0.1, which has no password, to the database
``asynclock`` made at the first start; a test that wants a password, or a
user short of a privilege, makes that user (:meth:`MariaDBServer.sql`).

The server loads the ``metadata_lock_info`` plugin (its table of named locks
is how ``asynclock inspect`` lists the locks other clients hold) and runs
with ``innodb_flush_log_at_trx_commit=2`` by default: a
commit is written to the operating system at once (a killed server loses
nothing) and flushed to disk once a second (only a machine's crash loses
the last second: throwaway data). Pausing (SIGSTOP) freezes every thread of
the one process: a server that keeps its connections open but answers
nothing, like a partition.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .base import ServerProcess, free_port

#: The database the tests' URLs name.
DATABASE = "asynclock"


def mariadb_binaries() -> tuple[str, str, str] | None:
    """``mariadb-install-db``, ``mariadbd`` and the ``mariadb`` client, if installed."""
    install = shutil.which("mariadb-install-db")
    server = shutil.which("mariadbd") or ("/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
    client = shutil.which("mariadb")
    if install is None or server is None or client is None:
        return None
    return install, server, client


class MariaDBServer(ServerProcess):
    name = "mariadb"

    def __init__(self, port: int | None = None, workdir: Path | None = None, extra: Sequence[str] = ()) -> None:
        super().__init__(workdir)
        binaries = mariadb_binaries()
        if binaries is None:
            raise RuntimeError("MariaDB's mariadb-install-db/mariadbd/mariadb not found (tests/run.sh installs them)")
        self.install_db, self.server_bin, self.client_bin = binaries
        self.port = port or free_port()
        self.data_dir = self.workdir / "data"
        #: the server's temporary files: its own (bootstraps running at once in /tmp clash)
        self.tmp_dir = self.workdir / "tmp"
        self.socket_path = self.workdir / "mariadb.sock"
        self.extra = list(extra)
        self._as_root = ["--user=root"] if os.geteuid() == 0 else []
        try:
            self._install()
        except BaseException:
            self.cleanup()
            raise

    def _install(self) -> None:
        self.tmp_dir.mkdir(exist_ok=True)
        args = [
            self.install_db,
            "--no-defaults",
            f"--datadir={self.data_dir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            f"--tmpdir={self.tmp_dir}",
            *self._as_root,
        ]
        result = subprocess.run(
            args,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=180,
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout.decode(errors="replace")
            raise RuntimeError(f"mariadb-install-db failed ({result.returncode}):\n{output}")

    def command(self) -> Sequence[str]:
        return [
            self.server_bin,
            "--no-defaults",
            *self._as_root,
            f"--datadir={self.data_dir}",
            f"--tmpdir={self.tmp_dir}",
            f"--socket={self.socket_path}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.workdir / 'mariadbd.pid'}",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--performance-schema=OFF",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=1000",
            "--max-connect-errors=100000",
            "--log-warnings=1",
            # (information_schema.METADATA_LOCK_INFO: inspect lists the locks other clients hold)
            "--plugin-load-add=metadata_lock_info",
            *self.extra,
        ]

    def is_ready(self) -> bool:
        # The server listens once it accepts connections, and greets each at once
        # (the handshake packet: protocol version 10).
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            greeting = sock.recv(5)
        if len(greeting) < 5 or greeting[4] != 10:
            return False
        try:
            self.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}", timeout=10)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False  # (the unix socket may come a moment after the port)
        return True

    # -- what the tests use ---------------------------------------------------

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{DATABASE}"

    def url_for(self, user: str, password: str | None = None, database: str = DATABASE) -> str:
        secret = f":{password}" if password is not None else ""
        return f"mysql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def sql(self, statements: str, *, user: str = "root", timeout: float = 30.0) -> str:
        """Run ``statements`` with the ``mariadb`` client over the unix socket; their output (tab-separated)."""
        result = subprocess.run(
            [self.client_bin, "--no-defaults", "-S", str(self.socket_path), "-u", user, "-N", "-B", "-e", statements],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mariadb client failed: {result.stderr.decode(errors='replace')}")
        return result.stdout.decode()

    def client_command(self, *args: str, user: str = "root") -> list[str]:
        """The command line of a ``mariadb`` client connected over TCP, as another program would."""
        return [self.client_bin, "--no-defaults", "-h", "127.0.0.1", "-P", str(self.port), "-u", user, *args]

    def restart(self, *, crash: bool = True, timeout: float = 60.0) -> None:
        """Stop it (SIGKILL, like a crash, or a clean shutdown) and start it again on the same port
        and data directory (InnoDB recovers its log)."""
        if crash:
            self.kill()
        else:
            self.stop()
        deadline = time.monotonic() + timeout
        while True:  # (the port must be free again before the new server binds it)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {self.port} still answers after the server stopped")
            time.sleep(0.02)
        self.start(timeout)
