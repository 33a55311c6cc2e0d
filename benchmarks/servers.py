"""The servers of a run (started here, on loopback, stopped at the end) and their counters.

The server classes are the test suite's (``tests/servers``). A backend whose
server cannot start here is skipped with the reason, which the table shows.
Server-side counters are read over a plain socket so that reading them is
never counted as the client's own traffic.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Servers:
    urls: dict[str, str] = field(default_factory=dict)  # backend -> url
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why
    versions: dict[str, str] = field(default_factory=dict)
    handles: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def started(backends: list[str]) -> Iterator[Servers]:
    servers = Servers()
    try:
        for backend in backends:
            if backend == "memory":
                servers.urls["memory"] = "memory://"
                continue
            try:
                _start(backend, servers)
            except Exception as exc:  # noqa: BLE001 - a missing server skips its backend
                servers.skipped[backend] = f"server not started: {str(exc).splitlines()[0][:160]}"
        yield servers
    finally:
        for handle in servers.handles.values():
            with contextlib.suppress(Exception):
                handle.cleanup()


def _start(backend: str, servers: Servers) -> None:
    if backend == "redis":
        from tests.servers.redis import RedisServer

        server: Any = RedisServer(extra=["--maxclients", "4000"])
        servers.handles["redis"] = server
        server.start()
        servers.urls["redis"] = server.url
        info = redis_info(server.port, "server")
        servers.versions["redis"] = "Redis " + info.get("redis_version", "?")
    elif backend == "zookeeper":
        from tests.servers.zookeeper import ZooKeeperServer

        server = ZooKeeperServer()
        servers.handles["zookeeper"] = server
        server.start(timeout=90)
        servers.urls["zookeeper"] = server.url
        servers.versions["zookeeper"] = "ZooKeeper " + zk_mntr(server.port).get("zk_version", "?").split("-")[0]
    elif backend == "postgres":
        from tests.servers.postgres import PostgresServer

        server = PostgresServer()
        servers.handles["postgres"] = server
        server.start(timeout=90)
        servers.urls["postgres"] = server.url
        version = subprocess.run(
            [str(server.bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        servers.versions["postgres"] = version.replace("postgres (PostgreSQL) ", "PostgreSQL ")
    elif backend == "mysql":
        from tests.servers.mysql import MariaDBServer

        server = MariaDBServer()
        servers.handles["mysql"] = server
        server.start(timeout=90)
        servers.urls["mysql"] = server.url
        version = subprocess.run([server.server_bin, "--version"], capture_output=True, text=True, check=False).stdout
        servers.versions["mysql"] = "MariaDB " + version.split("Ver ", 1)[-1].split("-", 1)[0]
    elif backend == "etcd":
        from tests.servers.etcd import EtcdServer

        server = EtcdServer()
        servers.handles["etcd"] = server
        server.start(timeout=60)
        servers.urls["etcd"] = server.url
        version = subprocess.run([server.binary, "--version"], capture_output=True, text=True, check=False).stdout
        servers.versions["etcd"] = "etcd " + version.split("Version:", 1)[-1].split()[0]
    else:
        raise ValueError(f"unknown backend {backend!r}")


# -- Redis: INFO over a plain socket ------------------------------------------------


def redis_command(port: int, *args: str) -> bytes:
    """Send one command (RESP) and return the raw reply body."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        data = b""
        while b"\r\n" not in data:
            data += sock.recv(65536)
        head, rest = data.split(b"\r\n", 1)
        if head.startswith(b"$"):
            size = int(head[1:])
            while len(rest) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
            return rest[:size]
        if head.startswith(b"-"):
            raise RuntimeError(head.decode())
        return head


def redis_info(port: int, section: str) -> dict[str, str]:
    text = redis_command(port, "INFO", section).decode()
    lines = (line for line in text.splitlines() if ":" in line and not line.startswith("#"))
    return {key: value for key, _, value in (line.partition(":") for line in lines)}


#: Commands that only the benchmark itself sends around a measurement.
_ADMIN = {"info", "config|resetstat", "config"}


def redis_reset(port: int) -> None:
    redis_command(port, "CONFIG", "RESETSTAT")


def redis_commandstats(port: int) -> dict[str, int]:
    """Calls per command since the last reset (Lua scripts' inner commands included)."""
    stats: dict[str, int] = {}
    for key, value in redis_info(port, "commandstats").items():
        command = key.removeprefix("cmdstat_")
        if command in _ADMIN:
            continue
        fields = dict(part.split("=", 1) for part in value.split(","))
        stats[command] = int(fields["calls"])
    return stats


# -- ZooKeeper: mntr ------------------------------------------------------------------


def zk_mntr(port: int) -> dict[str, str]:
    from tests.servers.zookeeper import four_letter

    text = four_letter(port, b"mntr", timeout=5).decode(errors="replace")
    return dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)


def zk_packets(port: int) -> int:
    """Requests the server has received so far (pings included)."""
    return int(zk_mntr(port).get("zk_packets_received", "0"))


# -- PostgreSQL: its own counters, and /proc ------------------------------------------

#: Transaction ids assigned so far (the next one; reading it assigns none) and the WAL position.
PG_WORK_SQL = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xid, pg_current_wal_insert_lsn() AS lsn"


def process_tree_cpu(root: int) -> float:
    """CPU seconds used so far by the process ``root`` and its children (a PostgreSQL
    postmaster and every backend it forked): the scheduler's own count where the
    kernel shows it (``/proc/PID/sched``, µs), else user + system clock ticks; 0
    where /proc is missing."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(entry) != root and int(fields[1]) != root:
                continue
            total += _scheduled(entry) or (int(fields[11]) + int(fields[12])) / tick
    return total


def _scheduled(pid: str) -> float | None:
    """Seconds on a CPU, from ``/proc/PID/sched`` (None where the kernel does not show it)."""
    try:
        with open(f"/proc/{pid}/sched") as sched:
            for line in sched:
                if line.startswith("se.sum_exec_runtime"):
                    return float(line.split(":", 1)[1]) / 1000
    except (OSError, ValueError):
        return None
    return None


def server_counter(servers: Servers, backend: str) -> tuple[Any, Any] | None:
    """(reset-or-snapshot, read-delta) callables for the backend's server-side request count."""
    if backend == "redis":
        port = servers.handles["redis"].port

        def reset_redis() -> int:
            redis_reset(port)
            return 0

        def read_redis() -> dict[str, int]:
            return redis_commandstats(port)

        return reset_redis, read_redis
    if backend == "zookeeper":
        port = servers.handles["zookeeper"].port
        return (lambda: zk_packets(port)), (lambda: zk_packets(port))
    return None
