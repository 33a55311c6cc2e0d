"""The demo's terminal timeline: workers' reports printed in time order, one line each.

Reports from different processes arrive through different pipes, so each is
held back for :data:`REORDER_S` and printed by its own timestamp. While it
prints, the timeline follows the story (who holds the lock, who died or was
robbed of its lease) to say on each acquisition how the lock got there, and
keeps the counts for the closing summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import shutil
import statistics
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

#: One report: ``t`` (``time.monotonic()``), ``w`` (who), ``ev`` (what), and what goes with it.
Event = dict[str, Any]
Emit = Callable[[Event], None]

#: How long the timeline holds events back to print them in time order
#: (reports from different processes arrive through different pipes).
REORDER_S = 0.25


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
            due = self._heap[0][0] + REORDER_S
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
