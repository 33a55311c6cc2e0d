"""PostgreSQL from the distribution's packages, initdb'ed into a temp dir.

``initdb`` and ``postgres`` refuse to run as root, so when the tests run as
root both run as the ``postgres`` user (the Debian packages create it) in a
temp dir owned by that user. The server listens on a free loopback port and on
a unix socket inside the temp dir, with ``fsync=off`` (throwaway data).

Authentication: every role is trusted, except the members of
``PASSWORD_GROUP``, which log in with a password (scram-sha-256): a test
makes such a role to see a password refused, at no cost to the others.
``tls=True`` makes a server that also speaks TLS, with a self-signed
certificate for 127.0.0.1 (``cert_file``), made with ``openssl``.

Pausing stops the postmaster and every backend it forked (each backend is its
own process group, so signalling the postmaster alone would leave them
answering): that is a server that keeps its connections open but answers
nothing, like a partition.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .base import ServerProcess, free_port

#: Members of this role log in with a password; every other role is trusted.
PASSWORD_GROUP = "asynclock_password"

_HBA = f"""\
# type  database  user             address       method
local   all       +{PASSWORD_GROUP}                scram-sha-256
host    all       +{PASSWORD_GROUP} 127.0.0.1/32   scram-sha-256
host    all       +{PASSWORD_GROUP} ::1/128        scram-sha-256
local   all       all                            trust
host    all       all              127.0.0.1/32   trust
host    all       all              ::1/128        trust
local   replication all                          trust
host    replication all            127.0.0.1/32   trust
"""


def postgres_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``: PATH first, then Debian's layout (newest version)."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("postgres") is not None:
        return Path(found).parent

    def version(path: str) -> tuple[int, ...]:
        match = re.search(r"/postgresql/([\d.]+)/bin/initdb$", path)
        return tuple(int(part) for part in match.group(1).split(".")) if match else ()

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    for initdb in reversed(candidates):
        directory = Path(initdb).parent
        if (directory / "postgres").exists():
            return directory
    return None


class PostgresServer(ServerProcess):
    name = "postgres"

    def __init__(
        self, port: int | None = None, workdir: Path | None = None, extra: Sequence[str] = (), *, tls: bool = False
    ) -> None:
        super().__init__(workdir)
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL's initdb/postgres not found (tests/run.sh installs them)")
        self.bin_dir = bin_dir
        self.port = port or free_port()
        self.data_dir = self.workdir / "data"
        self.socket_dir = self.workdir / "sock"
        self.extra = list(extra)
        self.cert_file = self.workdir / "server.crt"
        self.key_file = self.workdir / "server.key"
        self.tls = tls
        self.user = "postgres"
        self._run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise RuntimeError("running as root needs a 'postgres' user to run the server as") from exc
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        try:
            self._initdb()
            if tls:
                self._make_certificate()
        except BaseException:
            self.cleanup()
            raise

    # -- setup ----------------------------------------------------------------

    def _initdb(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        if self._run_as is not None:
            for path in (self.workdir, self.socket_dir):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)
        args = [
            str(self.bin_dir / "initdb"),
            "-D", str(self.data_dir),
            "-U", self.user,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]  # fmt: skip
        result = subprocess.run(
            args,
            cwd=self.workdir,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=self.preexec(),
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout.decode(errors='replace')}")
        (self.data_dir / "pg_hba.conf").write_text(_HBA)

    def _make_certificate(self) -> None:
        """A self-signed certificate for 127.0.0.1 and its key, readable by the server only."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl not found: a TLS test server needs it to make its certificate")
        args = [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(self.key_file), "-out", str(self.cert_file),
        ]  # fmt: skip
        result = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"openssl failed: {result.stderr.decode(errors='replace')}")
        os.chmod(self.key_file, 0o600)
        if self._run_as is not None:
            for path in (self.key_file, self.cert_file):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        if self._run_as is not None:
            env["HOME"] = str(self.workdir)
        return env

    def preexec(self) -> Callable[[], None] | None:
        run_as = self._run_as
        if run_as is None:
            return None

        def drop_privileges() -> None:
            os.setgroups([])
            os.setgid(run_as.pw_gid)
            os.setuid(run_as.pw_uid)

        return drop_privileges

    # -- what the tests use ---------------------------------------------------

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    @property
    def url(self) -> str:
        return self.dsn

    def command(self) -> Sequence[str]:
        return [
            str(self.bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.socket_dir}",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=300",
            "-c", "shared_buffers=32MB",
            *(["-c", "ssl=on", "-c", f"ssl_cert_file={self.cert_file}", "-c", f"ssl_key_file={self.key_file}"]
              if self.tls else []),
            *self.extra,
        ]  # fmt: skip

    def is_ready(self) -> bool:
        # The postmaster writes "ready" as the status line of postmaster.pid
        # once it accepts connections.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        # (the first line names the postmaster: after a crash the old file stays behind)
        return len(lines) >= 8 and lines[0].strip() == str(self.pid) and lines[7].strip() == "ready"

    def _children(self) -> list[int]:
        """Pids of the processes the postmaster forked (backends, background workers)."""
        if not self.running:
            return []
        found = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                text = (task / "children").read_text()
                found += [int(pid) for pid in text.split()]
        return found

    def pause(self) -> None:
        """SIGSTOP the postmaster first (no new forks), then every process it forked."""
        if not self.running:
            return
        os.kill(self.pid, signal.SIGSTOP)
        self._paused = True
        for pid in self._children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        if not (self.running and self._paused):
            return
        for pid in self._children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        os.kill(self.pid, signal.SIGCONT)
        self._paused = False

    def restart(self, *, crash: bool = True, timeout: float = 30.0) -> None:
        """Stop it (SIGKILL of the postmaster, like a crash, or a fast shutdown) and start it
        again on the same port and data directory (crash recovery replays the WAL)."""
        children = self._children()
        if crash:
            self.kill()
            # Its backends notice the postmaster's death and exit; a new postmaster
            # refuses to start while one of them still holds the shared memory.
            deadline = time.monotonic() + timeout
            while any(_alive(pid) for pid in children):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"backends of the killed postmaster still alive: {children}")
                time.sleep(0.02)
        else:
            self.stop()
        self.start(timeout)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients, then exit); SIGKILL after a deadline."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._paused = False


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
