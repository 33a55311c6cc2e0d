"""The paused holder of ``tests/test_fencing.py``: holder A of a lock, writing to a store
through a fence, that the test pauses past its ttl.

A runs in a process of its own (``python -m tests.fenced_holder '<json>'``, paused by
SIGSTOP) or, on ``memory://`` (whose lock table is per process), on an event loop of
its own in a thread of the test's process (paused by blocking that loop). Either way
the test drives it one line at a time:

* ``acquire`` → ``held <token>``: A takes the lock (detached: no body to cancel);
* ``write <value>`` → ``written`` or ``stale <mark>`` (``stale -``: refused before any
  I/O, the lease known lost): a fenced write with A's lease;
* ``prepare`` → ``prepared``: the step before a fenced write that needs the server
  (PostgreSQL: BEGIN), so that a write sent next goes out as one request;
* ``send <value>`` → ``sending``: a fenced write with A's token (as a part of A that
  was handed the token writes; a check of the lease, had it been passed, would have
  passed before the pause just as well), started and on its way; ``outcome`` → its
  result, as ``write`` says it;
* ``unfenced <value>`` → ``written``: a plain write, no fence;
* ``close`` → ``closed``.

:class:`RedisStore` and :class:`PostgresStore` are the stores, used by the test too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis

import asynclock
from asynclock.fencing import PostgresFence, RedisFence, StaleToken
from tests.servers import scaled

#: the lock A and B contend for, and the resource its fence guards
NAME = "orders:42"


class RedisStore:
    """The state in a Redis key; the fence's mark beside it, in its slot (``{orders:42}``)."""

    def __init__(self, url: str, prefix: str) -> None:
        # no socket timeout: a write held back while its sender is paused must wait, not fail
        self.client = aioredis.Redis.from_url(url, socket_timeout=None)
        self.fence = RedisFence(self.client, prefix=f"{prefix}-fence")
        self.key = f"{prefix}:{{{NAME}}}:state"
        self.prefix = prefix

    async def open(self) -> None:
        await self.client.ping()

    async def create(self) -> None:
        pass

    async def prepare(self) -> None:
        pass

    async def fenced(self, held: asynclock.Lease | int, value: str) -> None:
        await self.fence.call(held, "SET", self.key, value, resource=NAME)

    async def unfenced(self, value: str) -> None:
        await self.client.set(self.key, value)

    async def read(self) -> str | None:
        value = await self.client.get(self.key)
        return None if value is None else value.decode()

    async def mark(self) -> int | None:
        value = await self.client.get(self.fence.mark_key(NAME))
        return None if value is None else int(value)

    async def drop(self) -> None:
        await self.client.delete(self.key, self.fence.mark_key(NAME))

    async def close(self) -> None:
        await self.client.aclose()


class PostgresStore:
    """The state in a row of ``<prefix>_orders``; the marks in ``<prefix>_fences``."""

    def __init__(self, dsn: str, prefix: str) -> None:
        self.dsn = dsn
        self.orders = f"{prefix}_orders"
        self.fence = PostgresFence(table=f"{prefix}_fences")
        self.conn: Any = None
        self._transaction: Any = None

    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)

    async def create(self) -> None:
        await self.conn.execute(f"CREATE TABLE {self.orders} (id int PRIMARY KEY, state text)")
        await self.conn.execute(f"INSERT INTO {self.orders} VALUES (42, 'new')")

    async def prepare(self) -> None:
        self._transaction = self.conn.transaction()
        await self._transaction.start()

    async def fenced(self, held: asynclock.Lease | int, value: str) -> None:
        transaction, self._transaction = self._transaction, None
        if transaction is None:  # (not prepared)
            transaction = self.conn.transaction()
            await transaction.start()
        try:
            await self.fence.advance(self.conn, held, resource=NAME)
            await self.conn.execute(f"UPDATE {self.orders} SET state = $1 WHERE id = 42", value)
        except BaseException:
            await transaction.rollback()
            raise
        await transaction.commit()

    async def unfenced(self, value: str) -> None:
        await self.conn.execute(f"UPDATE {self.orders} SET state = $1 WHERE id = 42", value)

    async def read(self) -> str | None:
        state: str | None = await self.conn.fetchval(f"SELECT state FROM {self.orders} WHERE id = 42")
        return state

    async def mark(self) -> int | None:
        mark: int | None = await self.conn.fetchval(f"SELECT token FROM {self.fence.table} WHERE resource = $1", NAME)
        return mark

    async def drop(self) -> None:
        await self.conn.execute(f"DROP TABLE IF EXISTS {self.orders}, {self.fence.table}")

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


def open_store(kind: str, url: str, prefix: str) -> RedisStore | PostgresStore:
    return RedisStore(url, prefix) if kind == "redis" else PostgresStore(url, prefix)


@dataclass
class Config:
    url: str
    prefix: str
    ttl: float
    store: str
    store_url: str
    store_prefix: str


class Holder:
    """Holder A: its lock client, its lease, its store (reached through the test's proxy)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.locks = asynclock.connect(config.url, ttl=config.ttl, prefix=config.prefix)
        self.store = open_store(config.store, config.store_url, config.store_prefix)
        self.lease: asynclock.Lease | None = None
        self.sending: asyncio.Task[str] | None = None

    async def open(self) -> None:
        await self.locks.open()
        await self.store.open()

    async def handle(self, line: str) -> str:
        word, _, value = line.partition(" ")
        if word == "acquire":
            self.lease = await self.locks.lock(NAME).acquire(detached=True)
            return f"held {self.lease.token}"
        if word == "write":
            return await self._write(value)
        if word == "prepare":
            await self.store.prepare()
            return "prepared"
        if word == "send":
            assert self.lease is not None and self.lease.token is not None
            self.sending = asyncio.create_task(self._write(value, self.lease.token))
            await asyncio.sleep(0)  # it runs up to its first request
            return "sending"
        if word == "outcome":
            assert self.sending is not None
            return await self.sending
        if word == "unfenced":
            await self.store.unfenced(value)
            return "written"
        if word == "close":
            await self.close()
            return "closed"
        return f"unknown command {line!r}"

    async def _write(self, value: str, token: int | None = None) -> str:
        assert self.lease is not None
        try:
            await self.store.fenced(self.lease if token is None else token, value)
        except StaleToken as stale:
            return f"stale {'-' if stale.mark is None else stale.mark}"
        return "written"

    async def close(self) -> None:
        with contextlib.suppress(asynclock.LockError):
            await self.locks.aclose()
        await self.store.close()


async def serve(config: Config) -> None:
    """A in a process of its own: one answer line per command line."""
    holder = Holder(config)
    await holder.open()
    print("started", flush=True)
    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        print(await holder.handle(line), flush=True)
        if line == "close":
            return


class HolderProcess:
    """A in a process of its own, paused by SIGSTOP."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, config: Config) -> HolderProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.fenced_holder", json.dumps(asdict(config)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        holder = cls(proc)
        assert await holder._line() == "started"
        return holder

    async def _line(self) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(scaled(30)):
            return (await self.proc.stdout.readline()).decode().strip()

    async def ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()
        return await self._line()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.resume()
                async with asyncio.timeout(scaled(10)):
                    assert await self.ask("close") == "closed"
                    await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


class HolderThread:
    """A on an event loop of its own, in a thread of this process (memory://), paused by
    blocking that loop: what a stuck event loop does to a holder."""

    def __init__(self, config: Config) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="holder-a", daemon=True)
        self.thread.start()
        self.holder: Holder | None = None
        self._config = config
        self._paused: threading.Event | None = None

    @classmethod
    async def start(cls, config: Config) -> HolderThread:
        holder = cls(config)
        holder.holder = await holder._run(holder._make())
        return holder

    async def _make(self) -> Holder:
        holder = Holder(self._config)
        await holder.open()
        return holder

    async def _run(self, coro: Any) -> Any:
        async with asyncio.timeout(scaled(30)):
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def ask(self, line: str) -> str:
        assert self.holder is not None
        answer: str = await self._run(self.holder.handle(line))
        return answer

    def pause(self) -> None:
        self._paused = threading.Event()
        self.loop.call_soon_threadsafe(self._paused.wait)

    def resume(self) -> None:
        if self._paused is not None:
            self._paused.set()

    async def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.resume()
        if self.holder is not None:
            with contextlib.suppress(Exception):
                await self._run(self.holder.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join, 10)
        self.loop.close()


if __name__ == "__main__":
    asyncio.run(serve(Config(**json.loads(sys.argv[1]))))
