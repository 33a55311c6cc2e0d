"""The demo's scenario: contention first, then the two accidents a lock service exists for.

1. A worker dies while it holds the lock (SIGKILL of its process): nobody
   releases, so the lock comes back only when its lease runs out. On
   ``memory://`` the workers are threads of this process, so the dying worker
   is a frozen thread instead (the closest honest equivalent: its watchdog
   stops like a SIGSTOPped process's).
2. The lease is taken behind the holder's back (its key deleted on the
   server): the holder's watchdog finds out at its next renewal, the body of
   its ``async with`` is cancelled and ``LockLost`` comes out.

The coordinator acts on the workers' reports as they arrive, and the timeline
prints them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import sys
import time
from collections.abc import Callable
from typing import IO

import asynclock

from .._errors import plain
from .._options import mask_url
from ._server import EmbeddedRedis, redis_server_binary
from ._timeline import REORDER_S, Event, Timeline
from ._workers import LOCK_NAME, Handle, ProcessWorker, ThreadWorker


class _DemoFailed(Exception):
    pass


class Demo:
    """The coordinator: picks the server, starts the workers, stages the accidents, prints the summary."""

    def __init__(self, url: str | None, *, ttl: float, workers: int, color: bool, out: IO[str]) -> None:
        self._url = url
        self._ttl = ttl
        self._count = workers
        self._color = color
        self._out = out
        self._prefix = f"demo-{secrets.token_hex(3)}"
        self._server: EmbeddedRedis | None = None
        self._handles: list[Handle] = []
        self.timeline = Timeline(out, color=color, ttl=ttl, t0=time.monotonic())

    async def run(self) -> int:
        logging.getLogger("asynclock").addHandler(logging.NullHandler())  # the timeline tells the story
        printer = asyncio.get_running_loop().create_task(self.timeline.run())
        try:
            url, where = await self._choose_backend()
            await self._play(url, where)
            return 0
        except _DemoFailed as exc:
            self.timeline.flush()
            self.timeline.text(f"demo failed: {exc}", "bold", "red")
            return 1
        finally:
            printer.cancel()
            for handle in self._handles:
                handle.abort()
            if self._server is not None:
                self._server.stop()

    async def _choose_backend(self) -> tuple[str, str]:
        if self._url is not None and self._url.startswith("memory:"):
            return self._url, "memory:// (one lock table in this process)"
        if self._url is not None:
            try:
                # One request: fail here, clearly, rather than in every worker.
                async with asyncio.timeout(10), asynclock.connect(self._url) as locks:
                    await locks.lock(LOCK_NAME).info()
            except (ValueError, TypeError, ImportError, asynclock.LockError, OSError, TimeoutError) as exc:
                raise _DemoFailed(f"cannot use {mask_url(self._url)}: {plain(exc)}") from exc
            return self._url, f"the server at {self._url}"
        binary = redis_server_binary()
        if binary is not None and _has_redis_client():
            self._server = EmbeddedRedis(binary)
            await self._server.start()
            return self._server.url, f"a throwaway redis-server (pid {self._server.pid}, unix socket in a temp dir)"
        why = "no redis-server on PATH" if binary is None else "redis-py is missing (pip install 'asynclock[redis]')"
        self.timeline.text(f"({why}: running on memory://; use --url redis://HOST:PORT to use a server)", "dim")
        return "memory://", "memory:// (in-process lock table)"

    async def _play(self, url: str, where: str) -> None:
        T = self._ttl
        in_process = url.startswith("memory:")
        kind = "threads (memory:// lives in one process)" if in_process else "processes"
        self.timeline.text(f"asynclock demo: {self._count} worker {kind} contend for lock {LOCK_NAME!r}", "bold")
        self.timeline.text(f"on {where}; ttl {T:g}s, so each holder's watchdog renews every {T / 3:.2f}s", "bold")
        self.timeline.text(f"{'time':>8}  {'who':<5} event", "dim")
        handle_cls: type[ThreadWorker] | type[ProcessWorker] = ThreadWorker if in_process else ProcessWorker
        seeds = random.Random()
        for number in range(1, self._count + 1):
            handle: Handle = handle_cls(
                f"w{number}", url, prefix=self._prefix, ttl=T, seed=seeds.randrange(2**32), timeline=self.timeline
            )
            self._handles.append(handle)
        await asyncio.gather(*(handle.start() for handle in self._handles))
        position = 0
        for _ in range(self._count):
            _, position = await self._expect(lambda ev: ev["ev"] == "ready", 30, "the workers to start", position)

        # 1. Contention: handoffs, tokens, renewals.
        await asyncio.sleep(4 * T)

        # 2. A holder dies.
        held, position = await self._holder_at(0.2 * T)
        victim = self._handle(held["w"])
        if isinstance(victim, ProcessWorker):
            assert victim.proc is not None
            self.timeline.note(
                f"SIGKILL {victim.wid} (pid {victim.proc.pid}) while it holds token {held['token']}:"
                f" no release will come; the lock comes back {_comes_back(url)}",
                action="kill",
                victim=victim.wid,
            )
            victim.kill()
            self._handles.remove(victim)
            await victim.wait(10)
            back, position = await self._expect(_is_acquired, 3 * T, "the dead worker's lock to come back", position)
        else:
            assert isinstance(victim, ThreadWorker)
            self.timeline.note(
                f"memory:// lives in this one process, so no worker can be killed; instead {victim.wid}'s thread"
                f" freezes (like a SIGSTOPped process) while it holds token {held['token']}: its watchdog stops",
                action="freeze",
                victim=victim.wid,
            )
            victim.freeze(limit=10 * T)
            back, position = await self._expect(_is_acquired, 3 * T, "the frozen worker's lock to come back", position)
            await _sleep_until(float(back["t"]) + 0.5 * T)
            self.timeline.note(f"{victim.wid} thaws: its lease ran out while it was frozen", action="thaw")
            victim.thaw()
            await self._expect(_lock_lost_by(victim.wid), 2 * T, "LockLost", position)
        await asyncio.sleep(1.0 * T)

        # 3. The lease is taken behind the holder's back.
        if not _can_take_away(url):
            self.timeline.note("taking a lease away behind its holder's back is shown on Redis and memory:// only")
            await self._wind_down()
            return
        held, position = await self._holder_at(0.1 * T)
        async with asynclock.connect(url, prefix=self._prefix) as locks:
            key = locks.lock(LOCK_NAME).key
        self.timeline.note(
            f"delete key {key!r} behind {held['w']}'s back (it holds token {held['token']});"
            " its watchdog will find out at the next renewal",
            action="delete",
            victim=held["w"],
        )
        await self._take_away(url, key)
        await self._expect(_lock_lost_by(held["w"]), 2 * T, "LockLost", position)
        await self._expect(_is_acquired, 3 * T, "the next acquisition", position)
        await asyncio.sleep(0.5 * T)
        await self._wind_down()

    async def _wind_down(self) -> None:
        """Each worker finishes its job in hand and leaves; then the summary."""
        T = self._ttl
        self.timeline.note("asking every worker to finish its job and stop")
        for handle in self._handles:
            handle.stop()
        try:
            await asyncio.gather(*(handle.wait(3 * T + 5) for handle in self._handles))
        except (TimeoutError, RuntimeError) as exc:
            raise _DemoFailed(str(exc) or "a worker did not stop in time") from exc
        await asyncio.sleep(REORDER_S)
        self.timeline.flush()
        if self._url is not None and _is_redis(self._url):
            await self._clean_up_keys(self._url)
        self.timeline.text(self.timeline.summary(), "bold")

    async def _holder_at(self, into: float) -> tuple[Event, int]:
        """The next acquisition, once its holder is ``into`` seconds into its job and still holds it."""
        for _ in range(5):
            held, position = await self._expect(_is_acquired, 3 * self._ttl, "an acquisition", self.timeline.mark())
            await _sleep_until(float(held["t"]) + into)
            if not self.timeline.arrived_since(position, _let_go_by(held["w"])):
                return held, position
        raise _DemoFailed("the workers' reports come too late to act on (is the machine overloaded?)")

    def _handle(self, wid: str) -> Handle:
        return next(handle for handle in self._handles if handle.wid == wid)

    async def _expect(self, match: Callable[[Event], bool], timeout: float, what: str, after: int) -> tuple[Event, int]:
        """The first event from position ``after`` on that ``match`` accepts, and the position after it."""
        try:
            event, index = await self.timeline.wait_for(lambda ev: ev["ev"] == "crashed" or match(ev), timeout, after)
        except TimeoutError:
            raise _DemoFailed(f"waited {timeout:g}s for {what} in vain") from None
        if event["ev"] == "crashed":
            raise _DemoFailed(f"worker {event['w']} ended unexpectedly while the demo waited for {what}")
        return event, index + 1

    async def _take_away(self, url: str, key: str) -> None:
        if url.startswith("memory:"):
            from ..backends import memory

            memory.expire(LOCK_NAME, prefix=self._prefix)
            return
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        try:
            await client.delete(key)
        finally:
            await client.aclose()

    async def _clean_up_keys(self, url: str) -> None:
        """On a server of the user's, remove what this run left under its own prefix (the token counter)."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{self._prefix}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


def _comes_back(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    if scheme == "zk":
        return "when the server expires its ZooKeeper session"
    if scheme.startswith("postgres"):
        return "when PostgreSQL sees its connection close"
    return "when its lease runs out, a ttl after its last renewal"


def _is_redis(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("redis", "rediss", "unix")


def _can_take_away(url: str) -> bool:
    return _is_redis(url) or url.startswith("memory:")


def _is_acquired(event: Event) -> bool:
    return bool(event["ev"] == "acquired")


def _let_go_by(worker: str) -> Callable[[Event], bool]:
    return lambda event: event["w"] == worker and event["ev"] in ("released", "lost", "locklost")


def _lock_lost_by(worker: str) -> Callable[[Event], bool]:
    return lambda event: event["ev"] == "locklost" and event["w"] == worker


async def _sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))


def _has_redis_client() -> bool:
    try:
        import redis.asyncio  # noqa: F401
    except ImportError:
        return False
    return True


def run_demo(url: str | None, *, ttl: float, workers: int, color: bool, out: IO[str] | None = None) -> int:
    """Body of ``asynclock demo``; returns the exit status."""
    demo = Demo(url, ttl=ttl, workers=workers, color=color, out=out or sys.stdout)
    try:
        return asyncio.run(demo.run())
    except KeyboardInterrupt:
        demo.timeline.text("interrupted: workers and server stopped", "bold", "red")
        return 130
