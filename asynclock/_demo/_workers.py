"""The demo's workers, and the coordinator's handles on them.

A :class:`Worker` is one contender for the lock, with a client of its own. With
a server each worker is a process of its own (``asynclock demo-worker``, the
body of which is :func:`run_worker_process`) reporting JSON lines on stdout;
``CLOCK_MONOTONIC`` is system-wide on Linux, so their timestamps compare.
``memory://`` keeps its lock table inside one process, so there the workers
are threads, each with its own event loop and client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time

import asynclock

from ._timeline import Emit, Event, Timeline

#: The one lock every worker wants.
LOCK_NAME = "nightly-report"


class Worker:
    """One contender: takes the lock, does a job of 0.5-0.8 ttl under it, lets go, repeats.

    Reports through ``emit`` (a dict per event, stamped with ``time.monotonic()``)
    what its client's ``on_event`` callback sees, plus ``LockLost`` when it
    comes out of ``async with``.
    """

    def __init__(self, wid: str, url: str, *, prefix: str, ttl: float, seed: int, emit: Emit) -> None:
        self.wid = wid
        self._url = url
        self._prefix = prefix
        self._ttl = ttl
        self._rng = random.Random(seed)
        self._emit_raw = emit
        self._lease: asynclock.Lease | None = None
        self._holding = False
        self._released_at: float | None = None
        self._held_since: float | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def emit(self, event: Event, at: float | None = None) -> None:
        event.setdefault("t", time.monotonic() if at is None else at)
        event["w"] = self.wid
        self._emit_raw(event)

    def stop(self) -> None:
        """Finish the job in hand (if any) and leave; call on the worker's loop."""
        self._stopping = True
        if not self._holding and self._task is not None:
            self._task.cancel()  # waiting or idle: a cancelled acquire never leaves a hold behind

    def _on_event(self, event: asynclock.LockEvent) -> None:
        now = time.monotonic()
        report: Event = {"ev": event.kind, "token": event.token}
        if event.kind == "acquired":
            report["wait_s"] = event.wait_s
        elif event.kind == "renewed":
            lease = self._lease
            if lease is not None:
                report["good_for"] = lease.expires_at - asyncio.get_running_loop().time()
        elif event.kind == "released":
            now = self._released_at or now  # when the holder let go, not when the server answered
            # Measured here: event.held_s also counts the time spent queued on ZooKeeper and PostgreSQL.
            report["held_s"] = now - self._held_since if self._held_since is not None else event.held_s
        elif event.kind == "lost":
            report["held_s"] = event.held_s
            report["reason"] = event.reason
        self.emit(report, now)

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            async with asynclock.connect(
                self._url, ttl=self._ttl, prefix=self._prefix, on_event=self._on_event
            ) as locks:
                self.emit({"ev": "ready", "pid": os.getpid()})
                lock = locks.lock(LOCK_NAME)
                while not self._stopping:
                    await self._job(lock)
                    # A short break, so that the others get a turn.
                    await asyncio.sleep(self._rng.uniform(0.05, 0.15) * self._ttl)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        self.emit({"ev": "stopped"})

    async def _job(self, lock: asynclock.Lock) -> None:
        length = self._rng.uniform(0.5, 0.8) * self._ttl
        started = time.monotonic()
        try:
            async with lock as lease:
                self._lease, self._holding = lease, True
                started = self._held_since = time.monotonic()
                try:
                    await asyncio.sleep(length)  # the work the lock protects
                finally:
                    self._released_at = time.monotonic()
                    self._lease = None
        except asynclock.LockLost as exc:
            worked = (self._released_at or time.monotonic()) - started
            await asyncio.sleep(0)  # let the client's "lost" event go out first
            self.emit({"ev": "locklost", "message": str(exc), "worked_s": worked, "job_s": length})
        finally:
            self._holding = False


def run_worker_process(wid: str, url: str, *, prefix: str, ttl: float, seed: int) -> int:
    """Body of ``asynclock demo-worker``: one worker, JSON lines out, commands in on stdin."""
    logging.getLogger("asynclock").addHandler(logging.NullHandler())  # the timeline tells the story

    def emit(event: Event) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    worker = Worker(wid, url, prefix=prefix, ttl=ttl, seed=seed, emit=emit)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

        async def commands() -> None:
            # "stop" asks for a clean end; end of input means the coordinator is gone.
            while (line := await reader.readline()) and line.strip() != b"stop":
                pass
            worker.stop()

        listener = loop.create_task(commands())
        try:
            await worker.run()
        finally:
            listener.cancel()

    try:
        asyncio.run(main())
    except (asynclock.LockError, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # one line on the timeline, not a traceback
        return 1
    return 0


# -- the coordinator's side ------------------------------------------------------------


class Handle:
    """The coordinator's side of one worker."""

    wid: str

    async def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    async def wait(self, timeout: float) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Make sure nothing of it is left running (Ctrl-C, errors)."""
        raise NotImplementedError


class ProcessWorker(Handle):
    """A worker in a process of its own: ``python -m asynclock demo-worker``."""

    def __init__(self, wid: str, url: str, *, prefix: str, ttl: float, seed: int, timeline: Timeline) -> None:
        self.wid = wid
        self._args = ["--url", url, "--prefix", prefix, "--ttl", repr(ttl), "--id", wid, "--seed", str(seed)]
        self._timeline = timeline
        self.proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._watcher: asyncio.Task[None] | None = None
        self.killed = False

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "asynclock",
            "demo-worker",
            *self._args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches the coordinator only; it ends the workers
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        loop = asyncio.get_running_loop()
        self._readers = [
            loop.create_task(self._read(self.proc.stdout, json_lines=True)),
            loop.create_task(self._read(self.proc.stderr, json_lines=False)),
        ]
        self._watcher = loop.create_task(self._watch())

    async def _watch(self) -> None:
        assert self.proc is not None
        await asyncio.gather(*self._readers)
        code = await self.proc.wait()
        if not self.killed and code != 0:
            self._timeline.push({"t": time.monotonic(), "w": self.wid, "ev": "crashed", "code": code})

    async def _read(self, stream: asyncio.StreamReader, *, json_lines: bool) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            event: Event | None = None
            if json_lines:
                with contextlib.suppress(ValueError):
                    event = json.loads(text)
            if event is None or not isinstance(event, dict):
                event = {"t": time.monotonic(), "w": self.wid, "ev": "output", "text": text}
            elif event.get("ev") == "ready":
                event["process"] = True
            self._timeline.push(event)

    def kill(self) -> None:
        """SIGKILL, like a crash: no release, no more renewals."""
        assert self.proc is not None
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(b"stop\n")

    async def wait(self, timeout: float) -> None:
        assert self.proc is not None
        async with asyncio.timeout(timeout):
            code = await self.proc.wait()
            await asyncio.gather(*self._readers)
            if self._watcher is not None:
                await self._watcher
        if code != 0 and not self.killed:
            raise RuntimeError(f"worker {self.wid} exited with status {code}")

    def abort(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        for task in [*self._readers, self._watcher]:
            if task is not None:
                task.cancel()


class ThreadWorker(Handle):
    """A worker in a thread of this process with an event loop of its own (for ``memory://``)."""

    def __init__(self, wid: str, url: str, *, prefix: str, ttl: float, seed: int, timeline: Timeline) -> None:
        self.wid = wid
        coordinator = asyncio.get_running_loop()

        def emit(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the coordinator's loop is gone (Ctrl-C)
                coordinator.call_soon_threadsafe(timeline.push, event)

        self._emit = emit
        self._worker = Worker(wid, url, prefix=prefix, ttl=ttl, seed=seed, emit=emit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._thaw = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"asynclock-demo-{wid}", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._started.set()
            await self._worker.run()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported on the timeline and by wait()
            self._error = exc
            self._emit({"t": time.monotonic(), "w": self.wid, "ev": "crashed", "code": repr(exc)})
        finally:
            self._started.set()

    async def start(self) -> None:
        self._thread.start()
        await asyncio.to_thread(self._started.wait, 10)

    def freeze(self, limit: float) -> None:
        """Block this worker's event loop (its job and its watchdog) until ``thaw`` or ``limit`` s."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._thaw.wait, limit)

    def thaw(self) -> None:
        self._thaw.set()

    def stop(self) -> None:
        self._thaw.set()
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._worker.stop)

    async def wait(self, timeout: float) -> None:
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"worker {self.wid} did not stop")
        if self._error is not None:
            raise RuntimeError(f"worker {self.wid} failed: {self._error!r}") from self._error

    def abort(self) -> None:
        self.stop()
