"""``asynclock demo``: a live timeline of workers contending for one lock.

The coordinator (this process) starts the workers, prints what they report in
time order, and stages the two accidents a lock service exists for:

1. a worker dies while it holds the lock (SIGKILL of its process): nobody
   releases, so the lock comes back only when its lease runs out;
2. the lease is taken behind the holder's back (its key deleted on the
   server): the holder's watchdog finds out at its next renewal, the body of
   its ``async with`` is cancelled and ``LockLost`` comes out.

With a server each worker is a process of its own (``asynclock demo-worker``)
with its own client, reporting JSON lines on stdout; ``CLOCK_MONOTONIC`` is
system-wide on Linux, so their timestamps compare. ``memory://`` keeps its
lock table inside one process, so there the workers are threads, each with its
own event loop and client, and the dying worker is a frozen thread instead (the
closest honest equivalent: its watchdog stops like a SIGSTOPped process's).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import asynclock

#: The one lock every worker wants.
LOCK_NAME = "nightly-report"

#: How long the timeline holds events back to print them in time order
#: (reports from different processes arrive through different pipes).
_REORDER_S = 0.25

Event = dict[str, Any]
Emit = Callable[[Event], None]


# -- the worker ------------------------------------------------------------------


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


# -- the timeline -----------------------------------------------------------------


_ANSI = {
    "reset": "\033[0m",
    "bold": "\033[1m",
    "dim": "\033[2m",
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "blue": "\033[34m",
    "magenta": "\033[35m",
    "cyan": "\033[36m",
}
_WORKER_COLORS = ["cyan", "magenta", "blue", "green", "yellow"]
_SYMBOLS = {"acquired": "●", "released": "○", "renewed": "↻", "lost": "✗", "locklost": "✗", "demo": "▶"}
_ASCII_SYMBOLS = {"acquired": "*", "released": "o", "renewed": "~", "lost": "x", "locklost": "x", "demo": ">"}


@dataclass
class _Hold:
    worker: str
    token: int | None


@dataclass
class _Stats:
    acquisitions: int = 0
    handoffs: list[float] = field(default_factory=list)
    renewals: int = 0
    losses: int = 0
    lock_lost_raised: int = 0
    comebacks: list[float] = field(default_factory=list)


class Timeline:
    """Prints events in time order, one line each, and keeps the story's state."""

    def __init__(self, out: IO[str], *, color: bool, ttl: float, t0: float) -> None:
        self._out = out
        self._width = shutil.get_terminal_size().columns if _isatty(out) else None
        self._color = color
        self._ttl = ttl
        self._t0 = t0
        self._symbols = _SYMBOLS if _can_encode(out, "".join(_SYMBOLS.values())) else _ASCII_SYMBOLS
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self._arrived = asyncio.Event()
        self._arrivals: list[Event] = []  # in the order they arrived, for the demo's own cues
        self._arrival = asyncio.Event()
        self._worker_colors: dict[str, str] = {}
        # the story so far, as told by the events printed
        self.holder: _Hold | None = None
        self._last_release: tuple[str, float] | None = None
        self._gone: tuple[str, float, str] | None = None  # (worker, when, how) for a holder killed or frozen
        self._taken: tuple[str, float] | None = None  # (worker, when) for a key deleted behind its holder
        self._last_renewal: dict[str, float] = {}  # worker -> when its lease was last acquired or renewed
        self.stats = _Stats()

    # feeding and printing

    def push(self, event: Event) -> None:
        heapq.heappush(self._heap, (float(event["t"]), next(self._seq), event))
        self._arrived.set()
        self._arrivals.append(event)
        self._arrival.set()

    def note(self, text: str, **extra: Any) -> Event:
        """An action of the demo itself, stamped now."""
        event: Event = {"t": time.monotonic(), "w": "demo", "ev": "demo", "text": text, **extra}
        self.push(event)
        return event

    async def run(self) -> None:
        while True:
            self._arrived.clear()
            if not self._heap:
                await self._arrived.wait()
                continue
            due = self._heap[0][0] + _REORDER_S
            now = time.monotonic()
            if now < due:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due - now):
                        await self._arrived.wait()
                continue
            self._show(heapq.heappop(self._heap)[2])

    def flush(self) -> None:
        while self._heap:
            self._show(heapq.heappop(self._heap)[2])

    def mark(self) -> int:
        """The position of the next event to arrive, for :meth:`wait_for`."""
        return len(self._arrivals)

    def arrived_since(self, position: int, match: Callable[[Event], bool]) -> bool:
        """Whether an event at ``position`` or later matches."""
        return any(match(event) for event in self._arrivals[position:])

    async def wait_for(self, match: Callable[[Event], bool], timeout: float, after: int) -> tuple[Event, int]:
        """The first event arrived at position ``after`` or later that ``match`` accepts, and its position.

        Cues come from arrivals, not from the (delayed) printing, so that the
        demo acts while a holder is still early in its job. Raises TimeoutError
        after ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while True:
                for index in range(after, len(self._arrivals)):
                    if match(self._arrivals[index]):
                        return self._arrivals[index], index
                after = len(self._arrivals)
                self._arrival.clear()
                await self._arrival.wait()

    def _paint(self, text: str, *styles: str) -> str:
        if not self._color or not styles:
            return text
        return "".join(_ANSI[s] for s in styles) + text + _ANSI["reset"]

    def _who(self, worker: str) -> str:
        label = f"{worker:<5}"
        if worker == "demo":
            return self._paint(label, "bold", "yellow")
        color = self._worker_colors.setdefault(worker, _WORKER_COLORS[len(self._worker_colors) % len(_WORKER_COLORS)])
        return self._paint(label, color)

    def line(self, t: float, worker: str, kind: str, what: str, detail: str, *styles: str) -> None:
        stamp = f"{t - self._t0:+7.3f}s"
        symbol = self._symbols.get(kind, " ")
        indent = len(stamp) + 2 + 5 + 1 + len(symbol) + 1 + 9 + 1
        pieces = self._wrap(detail, indent)
        detail_styles = styles if worker == "demo" else ()
        head = f"{self._paint(stamp, 'dim')}  {self._who(worker)} {self._paint(f'{symbol} {what:<9}', *styles)} "
        print((head + self._paint(pieces[0], *detail_styles)).rstrip(), file=self._out, flush=True)
        for piece in pieces[1:]:
            print(" " * indent + self._paint(piece, *detail_styles), file=self._out, flush=True)

    def text(self, text: str, *styles: str) -> None:
        for piece in self._wrap(text, 0):
            print(self._paint(piece, *styles), file=self._out, flush=True)

    def _wrap(self, text: str, indent: int) -> list[str]:
        # Only on a terminal: captured output stays one line per event, easy to grep.
        if self._width is None:
            return [text]
        return textwrap.wrap(text, max(30, self._width - indent - 1)) or [""]

    def _show(self, ev: Event) -> None:
        t, w, kind = float(ev["t"]), str(ev["w"]), str(ev["ev"])
        token = ev.get("token")
        if kind == "ready":
            where = f"pid {ev['pid']}" if ev.get("process") else "a thread of this process"
            self.line(t, w, kind, "ready", f"connected ({where})", "dim")
        elif kind == "acquired":
            self._acquired(t, w, token, float(ev.get("wait_s") or 0.0))
        elif kind == "renewed":
            self.stats.renewals += 1
            self._last_renewal[w] = t
            good = ev.get("good_for")
            until = f": good for {good:.2f}s more" if good is not None else ""
            self.line(t, w, kind, "renewed", f"token {token}{until}", "blue")
        elif kind == "released":
            self.line(t, w, kind, "released", f"token {token}, held {ev['held_s']:.2f}s", "dim")
            self._last_release = (w, t)
            if self.holder is not None and self.holder.worker == w:
                self.holder = None
        elif kind == "lost":
            self.stats.losses += 1
            self.line(t, w, kind, "lost", f"token {token}: {ev.get('reason')}", "bold", "red")
            if self.holder is not None and self.holder.worker == w:
                self.holder = None
        elif kind == "locklost":
            self.stats.lock_lost_raised += 1
            if ev["worked_s"] < ev["job_s"] - 0.005:
                what = f"its job was cancelled {ev['worked_s']:.2f}s into {ev['job_s']:.2f}s"
            else:
                what = "its job ran to the end, but the lease was gone by then"
            detail = f"out of `async with`: {what}"
            self.line(t, w, kind, "LockLost", detail, "bold", "red")
        elif kind == "demo":
            self.line(t, w, kind, "", str(ev["text"]), "bold", "yellow")
            victim = ev.get("victim")
            if ev.get("action") in ("kill", "freeze") and victim is not None:
                self._gone = (victim, t, "died" if ev["action"] == "kill" else "froze")
                if self.holder is not None and self.holder.worker == victim:
                    self.holder = None
            elif ev.get("action") == "delete" and victim is not None:
                self._taken = (victim, t)
        elif kind == "stopped":
            self.line(t, w, kind, "stopped", "left the lock alone and closed its client", "dim")
        elif kind == "crashed":
            self.line(t, w, "lost", "crashed", f"the worker ended unexpectedly ({ev['code']})", "bold", "red")
        elif kind == "output":
            self.line(t, w, kind, "said", str(ev["text"]), "dim")
        else:
            self.line(t, w, kind, kind, json.dumps({k: v for k, v in ev.items() if k not in ("t", "w", "ev")}))

    def _acquired(self, t: float, w: str, token: object, wait_s: float) -> None:
        self.stats.acquisitions += 1
        waited = f", waited {_duration(wait_s)}"
        previous = self.holder
        if (
            previous is not None
            and previous.worker != w
            and self._taken is not None
            and self._taken[0] == previous.worker
        ):
            detail = (
                f"token {token} while {previous.worker} still believes it holds token {previous.token}"
                " (its key was deleted): the higher fencing token tells the resource who is current"
            )
            waited = ""
        elif self._gone is not None:
            who, when, how = self._gone
            back = t - when
            self.stats.comebacks.append(back)
            detail = f"token {token}: lock back {back:.2f}s after {who} {how} holding it"
            renewed = self._last_renewal.get(who)
            if renewed is not None:
                detail += f", {t - renewed:.2f}s after its last renewal (ttl {self._ttl:g}s)"
        elif self._taken is not None:
            victim = "its" if self._taken[0] == w else f"{self._taken[0]}'s"
            detail = f"token {token}, {_duration(t - self._taken[1])} after {victim} key was deleted"
        elif self._last_release is not None and self._last_release[0] != w:
            latency = t - self._last_release[1]
            self.stats.handoffs.append(latency)
            detail = f"token {token}: handoff from {self._last_release[0]} in {_duration(latency)}"
        elif self._last_release is not None:
            detail = f"token {token} again: nobody else was waiting"
        else:
            detail = f"token {token}: first holder"
        self.line(t, w, "acquired", "acquired", detail + waited, "bold", "green")
        self.holder = _Hold(w, token if isinstance(token, int) else None)
        self._last_renewal[w] = t
        self._last_release = self._gone = self._taken = None

    def summary(self) -> str:
        s = self.stats
        parts = [_count(s.acquisitions, "acquisition"), _count(len(s.handoffs), "handoff")]
        if s.handoffs:
            parts.append(f"median handoff latency {_duration(statistics.median(s.handoffs))}")
        parts.append(_count(s.renewals, "renewal"))
        parts.append(f"{_count(s.losses, 'lease')} lost ({s.lock_lost_raised} LockLost raised)")
        if s.comebacks:
            parts.append("lock back after the dead holder in " + ", ".join(f"{b:.2f}s" for b in s.comebacks))
        return "summary: " + ", ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms" if seconds < 1 else f"{seconds:.2f}s"


def _isatty(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _can_encode(out: IO[str], text: str) -> bool:
    try:
        text.encode(getattr(out, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


# -- the servers and the workers, seen from the coordinator ---------------------------------


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
        command = [
            self._binary,
            "--port", "0",  # no TCP at all: the unix socket only
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
        ]  # fmt: skip
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
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
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


class _Handle:
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


class ProcessWorker(_Handle):
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


class ThreadWorker(_Handle):
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


# -- the coordinator -------------------------------------------------------------------


class _DemoFailed(Exception):
    pass


class Demo:
    def __init__(self, url: str | None, *, ttl: float, workers: int, color: bool, out: IO[str]) -> None:
        self._url = url
        self._ttl = ttl
        self._count = workers
        self._color = color
        self._out = out
        self._prefix = f"demo-{secrets.token_hex(3)}"
        self._server: EmbeddedRedis | None = None
        self._handles: list[_Handle] = []
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
                raise _DemoFailed(f"cannot use {self._url}: {str(exc) or repr(exc)}") from exc
            return self._url, f"the server at {self._url}"
        binary = shutil.which("redis-server")
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
            handle: _Handle = handle_cls(
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
        await asyncio.sleep(_REORDER_S)
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

    def _handle(self, wid: str) -> _Handle:
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
            from .backends import memory

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
