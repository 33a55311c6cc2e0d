"""Hygiene checks run after every test (by an autouse fixture in ``tests/conftest.py``).

* no asyncio task of asynclock still pending when the test's event loop is
  done with the test (tasks named ``asynclock-*``, or whose coroutine is
  defined in the ``asynclock`` package);
* no "Task exception was never retrieved" logged by asyncio;
* the session redis-server, ZooKeeper server, PostgreSQL and MariaDB servers
  have no more client connections than before the test (PostgreSQL: client
  backends in ``pg_stat_activity``; MariaDB: its process list; a closed
  connection's session may take a moment to end, so the count is given a few
  seconds to settle).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import CoroutineType
from typing import Any

import asynclock

_PACKAGE = str(Path(asynclock.__file__).resolve().parent)


def _code_file(coro: Any) -> str:
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    return str(Path(code.co_filename).resolve()) if code is not None else ""


def is_asynclock_task(task: asyncio.Task[Any]) -> bool:
    if task.get_name().startswith("asynclock-"):
        return True
    coro = task.get_coro()
    return isinstance(coro, CoroutineType) and _code_file(coro).startswith(_PACKAGE)


def describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", repr(coro))
    frame = getattr(coro, "cr_frame", None)
    line = f":{frame.f_lineno}" if frame is not None else ""
    return f"{task.get_name()} running {where}{line}"


async def pending_asynclock_tasks(grace: float = 0.5) -> list[str]:
    """asynclock's tasks still pending in the running loop after ``grace`` seconds."""
    me = asyncio.current_task()
    deadline = time.monotonic() + grace
    while True:
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done() and is_asynclock_task(t)]
        if not left or time.monotonic() >= deadline:
            return [describe(t) for t in left]
        await asyncio.sleep(0.02)


class NeverRetrieved(logging.Handler):
    """Collects asyncio's "exception was never retrieved" reports."""

    def __init__(self, logger: str = "asyncio") -> None:
        super().__init__(logging.ERROR)
        self.logger = logging.getLogger(logger)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "never retrieved" in message:
            detail = f"{message}: {record.exc_info[1]!r}" if record.exc_info else message
            self.found.append(detail)

    def __enter__(self) -> NeverRetrieved:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.collect()  # an abandoned task reports its exception when collected
        self.logger.removeHandler(self)


def redis_connections(url: str) -> int:
    """Client connections of a redis-server, not counting the one asking."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()


def zookeeper_connections(port: int) -> int:
    """Client connections of a ZooKeeper server (``cons``), not counting the one asking."""
    from tests.servers.zookeeper import four_letter

    lines = four_letter(port, b"cons").decode(errors="replace").splitlines()
    return sum(1 for line in lines if "queued=" in line) - 1


#: client backends on a PostgreSQL server, not counting the one asking
_PG_CLIENTS = """
    SELECT count(*) FROM pg_stat_activity
    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


def postgres_connections(url: str) -> int:
    """Client connections of a PostgreSQL server (``pg_stat_activity``), not counting
    the one asking nor the server's own background processes."""
    import threading

    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return int(await conn.fetchval(_PG_CLIENTS))
        finally:
            await conn.close(timeout=10)

    # its own event loop in its own thread: the caller may be inside a running loop
    found: list[int | BaseException] = []

    def run() -> None:
        try:
            found.append(asyncio.run(count()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            found.append(exc)

    thread = threading.Thread(target=run, name="hygiene-postgres")
    thread.start()
    thread.join()
    if isinstance(found[0], BaseException):
        raise found[0]
    return found[0]


def mysql_connections(server: Any) -> int:
    """Client sessions of a MariaDB server we started (its process list, through the ``mariadb``
    client over the server's unix socket), not counting the one asking nor the server's own threads."""
    output = server.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND <> 'Daemon'")
    return int(output.strip()) - 1


def wait_connections(count: Callable[[], int], baseline: int, timeout: float = 3.0) -> int:
    """Wait until a server is back to ``baseline`` connections; the last count seen."""
    deadline = time.monotonic() + timeout
    while True:
        now = count()
        if now <= baseline or time.monotonic() >= deadline:
            return now
        time.sleep(0.05)
