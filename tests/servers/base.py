"""The shared part of every test server: a child process we own."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: Multiply every test ttl/timeout by this on slow machines (ASYNCLOCK_TEST_SCALE=2 …).
SCALE = float(os.environ.get("ASYNCLOCK_TEST_SCALE", "1"))


def scaled(seconds: float) -> float:
    return seconds * SCALE


#: Ports this process handed out, each with the open lock file that reserves it
#: against every other process of the test run (parallel workers, their children).
_RESERVED: dict[int, int] = {}
#: How many reservations a process keeps: the oldest is let go past this.
_KEEP = 512


def _reservation_dir() -> Path:
    """The directory of the ports' lock files, shared by every user's test runs (sticky, like /tmp)."""
    path = Path(tempfile.gettempdir()) / "asynclock-test-ports"
    try:
        path.mkdir()
    except FileExistsError:
        return path
    os.chmod(path, 0o1777)
    return path


def _reserve(port: int) -> bool:
    """Take the lock file of ``port`` for this process; False when another live process has it.

    The lock is an ``flock`` on an open file: it goes when the process does, so a
    crashed worker leaves nothing held."""
    fd = os.open(_reservation_dir() / str(port), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _RESERVED[port] = fd
    while len(_RESERVED) > _KEEP:
        os.close(_RESERVED.pop(next(iter(_RESERVED))))
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now, and that no other
    process of the test run (a parallel worker, a child process) is handed too.

    The kernel picks a port nobody uses (bind to port 0); it is free again once
    this returns, until the caller's server binds it, so it is also reserved by a
    lock file for as long as this process lives (the last ``_KEEP`` of them): two
    workers never start servers on one port, and a port a test wants closed is
    not opened by another worker's server."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _RESERVED and _reserve(port):
            return port
    raise RuntimeError("no free port that another test process has not reserved")


class ServerProcess:
    """A server process started (and only ever signalled) by us."""

    name = "server"

    def __init__(self, workdir: Path | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"asynclock-{self.name}-")) if workdir is None else workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"{self.name}.log"
        self._paused = False

    # to be provided by subclasses
    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def is_ready(self) -> bool:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    def preexec(self) -> Callable[[], None] | None:
        return None

    # life cycle
    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        self.proc = subprocess.Popen(
            list(self.command()),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env=self.env(),
            start_new_session=True,
            preexec_fn=self.preexec(),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.is_ready():
                    self._paused = False
                    return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {timeout}s:\n{self.log()}")

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return "(no log)"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its connections open.

        Returns once every thread of it is stopped: the signal only queues the
        stop, and a thread still running meanwhile (on a busy machine, for a
        millisecond or more) would answer a request sent after this returned.
        """
        if self.running:
            os.kill(self.pid, signal.SIGSTOP)
            self._paused = True
            deadline = time.monotonic() + 5
            while not _all_stopped(self.pid) and time.monotonic() < deadline:
                time.sleep(0.0005)

    def resume(self) -> None:
        if self.running and self._paused:
            os.kill(self.pid, signal.SIGCONT)
            self._paused = False

    def kill(self) -> None:
        """SIGKILL and reap, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._paused = False

    def stop(self) -> None:
        """SIGTERM (SIGKILL after a deadline) and reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._paused = False

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc; True where there is no /proc)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended
        if state not in ("T", "t", "Z", "X"):  # stopped (or a thread that has ended)
            return False
    return True
