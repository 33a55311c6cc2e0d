"""The checker: reads the workers' journals and the fenced store, finds violations.

Invariants, for one lock contended by many processes:

1. **Mutual exclusion**: no two critical sections overlap in real time, except
   where the older one was exposed to a fault that the lease cannot survive
   (its process frozen past the ttl, the server restarted empty under it): a
   *stale window*. A killed holder's section ends when SIGKILL was sent. A
   section lost at its trusted deadline ends at that deadline when its body
   saw the cancellation within ``LATE_CANCEL_SLACK`` of it: the library's
   part (the deadline) is what is checked, not how soon a loaded machine ran
   the process afterwards (counted as ``late_cancels``). A body that went on
   longer than that past its deadline ends where it ended. A body that
   started after its lease's deadline had passed (its process did not run
   between the grant, checked against the deadline, and the body: a pause
   like a frozen holder's) is in a stale window of its own (counted as
   ``dead_on_arrival``).
2. **Token order**: ordered by their start, sections carry strictly increasing
   fencing tokens (overlapping ones included: the newer holder has the higher token).
3. **Nothing lost**: the store's counter equals its number of accepted writes
   (every accepted write was a read-modify-write of the latest value), the
   accepted operations came in non-decreasing token order, and the workers'
   own accounts agree with the store's count.
4. **Refusals only where expected**: the store refused an operation only from
   a section in a stale window (anything else means a token went backwards).
5. Whatever a worker itself flagged (a hold left behind after a cancellation,
   an operation stuck past its bound), and any worker that died unasked.
6. **Warned before lost**: each lease lost because it could not be renewed
   (``renewal_failed``, ``connection_lost``) is counted, and so is each of
   them that had not gone *at risk* first (but for one whose body started
   within ``LATE_GRANT`` of its deadline, or after it: its grant was answered
   late, and no renewal was due before the deadline); the scenarios whose fault stalls
   the renewals of a holder that keeps running require none of the latter.
7. **Fenced writes**: each section also writes through asynclock's fence
   (``RedisFence``, with its lease), and a section ended by ``LockLost``
   writes once more with its bare token. In the order the store applied
   them, those writes never go back to an older token (one that did is a
   stale holder's write let through); the store refused a write with a
   lease only from a section in a stale window; and the workers' accounts
   of applied fenced writes agree with the store's.
8. **Liveness**: an acquire past its bound is a violation on a backend that
   queues its waiters (one Redis or Sentinel, ZooKeeper, PostgreSQL: first
   come, first served). The plain lock on the others (Redis Cluster,
   Redlock, memory) is not fair: a waiter can lose every
   race, so there it is a violation only if the lock stood still meanwhile
   (fewer than ``STARVED_HANDOVERS`` sections of others started); otherwise
   it is counted as *starved*.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.store import StoreState
from tests.servers.base import SCALE

#: a waiter of a non-fair lock past its bound is starved (not a violation) if
#: others started at least this many sections while it waited
STARVED_HANDOVERS = 3
#: A body that started with less lease left than this (a grant answered late, as after a frozen
#: server) had no renewal to warn of before its deadline, in seconds, before ASYNCLOCK_TEST_SCALE.
LATE_GRANT = 0.1
#: How long after its deadline a lost section's body may see the cancellation and still count as
#: ended at the deadline (the process waited for a core), in seconds, before ASYNCLOCK_TEST_SCALE.
LATE_CANCEL_SLACK = 0.1

#: the loss reasons of a lease that could not be renewed (what "at_risk" must announce)
RENEWAL_LOSSES = ("renewal_failed", "connection_lost")


@dataclass(frozen=True, slots=True)
class Section:
    worker: int
    sid: int
    start: float
    end: float
    token: int
    read: str | None
    write: str | None
    outcome: str
    #: the process was killed inside it (its end is when SIGKILL was sent)
    killed: bool = False
    #: its write through the fence with its lease: ok, refused (by the store), lost (refused
    #: before any I/O), sent or ? (unknown), None (none made)
    fenced: str | None = None
    #: its write with the bare token after the lease was lost (the same words)
    late: str | None = None
    #: the lease's trusted deadline when the body ended (None: not recorded)
    deadline: float | None = None

    @property
    def dead_on_arrival(self) -> bool:
        """Its body started after its lease's trusted deadline (its process paused after the grant)."""
        return self.deadline is not None and self.start >= self.deadline

    def exclusive_end(self, slack: float) -> float:
        """Where the section ends for mutual exclusion: at its deadline if it was lost there
        and its body saw that within ``slack``; else where the body ended."""
        if self.dead_on_arrival or self.deadline is None or self.outcome != "lost":
            return self.end
        if self.deadline < self.end <= self.deadline + slack:
            return self.deadline
        return self.end


@dataclass(frozen=True, slots=True)
class StaleWindow:
    """A fault during which an older holder may overlap a newer one."""

    start: float
    end: float
    #: only sections of this worker are exposed (None: any worker's)
    worker: int | None = None

    def exposes(self, section: Section) -> bool:
        if self.worker is not None and section.worker != self.worker:
            return False
        return section.start <= self.end and section.end >= self.start


@dataclass
class WorkerLog:
    """One worker's journal, parsed."""

    index: int
    sections: list[Section] = field(default_factory=list)
    open_starts: dict[int, tuple[float, int]] = field(default_factory=dict)
    #: planned hold time of each open section
    planned: dict[int, float] = field(default_factory=dict)
    #: end of each open section whose body is over (its release under way)
    ended: dict[int, float] = field(default_factory=dict)
    cancelled: int = 0
    unavailable: int = 0
    #: (asked, gave up) of each acquire that ended with BackendUnavailable
    gave_up: list[tuple[float, float]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: acquires past their bound on a backend without a queue: (asked, given up, report)
    stuck: list[tuple[float, float, str]] = field(default_factory=list)
    #: each lease lost: (time, loss reason, whether it went at risk first)
    lost: list[tuple[float, str | None, bool]] = field(default_factory=list)
    at_risk: int = 0
    done: bool = False
    pid: int | None = None
    client: str | None = None

    @classmethod
    def read(cls, index: int, path: Path) -> WorkerLog:
        log = cls(index)
        if not path.exists():
            return log
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                event: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL
            log.add(event)
        return log

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "ready":
            self.pid, self.client = event["pid"], event["client"]
        elif kind == "start":
            self.open_starts[event["sid"]] = (event["t"], event["token"])
            self.planned[event["sid"]] = float(event.get("hold", 0.0))
        elif kind == "end":
            self.ended[event["sid"]] = float(event["t"])
        elif kind == "section":
            self.open_starts.pop(event["sid"], None)
            self.planned.pop(event["sid"], None)
            self.ended.pop(event["sid"], None)
            self.sections.append(
                Section(
                    self.index,
                    event["sid"],
                    event["start"],
                    event["end"],
                    int(event["token"]),
                    event["read"],
                    event["write"],
                    event["outcome"],
                    fenced=event.get("fenced"),
                    late=event.get("late"),
                    deadline=event.get("deadline"),
                )
            )
        elif kind == "cancelled":
            self.cancelled += 1
        elif kind == "unavailable":
            self.unavailable += 1
            self.gave_up.append((float(event.get("asked", event["t"])), float(event["t"])))
        elif kind == "failed":
            self.failed.append(event["outcome"])
        elif kind == "violation":
            self.violations.append(event["what"])
        elif kind == "stuck":
            self.stuck.append((event["asked"], event["t"], f"{event['what']}; tasks:\n{event.get('tasks', '')}"))
        elif kind == "at_risk":
            self.at_risk += 1
        elif kind == "lost":
            self.lost.append((float(event["t"]), event.get("loss"), bool(event.get("warned"))))
        elif kind == "done":
            self.done = True

    def close_killed(self, killed_at: float) -> None:
        """Sections open when the process was killed end when SIGKILL was sent, or, if
        the body was over (the release under way), where it said its section ended."""
        for sid, (start, token) in sorted(self.open_starts.items()):
            end = self.ended.get(sid, killed_at)
            self.sections.append(
                Section(self.index, sid, start, end, token, "?", "?", "killed", killed=True, fenced="?")
            )
        self.open_starts.clear()
        self.ended.clear()


@dataclass
class Verdict:
    """What a run proved (or not)."""

    sections: int = 0
    cancelled_ops: int = 0
    unavailable: int = 0
    losses: int = 0
    refused: int = 0
    accepted_writes: int = 0
    overlaps_allowed: int = 0
    #: lost sections whose body saw its deadline's cancellation late, within LATE_CANCEL_SLACK
    late_cancels: int = 0
    #: sections whose body started after its lease's deadline (a process paused after the grant)
    dead_on_arrival: int = 0
    #: waiters that lost every race for a non-fair lock past the bound while it kept changing hands
    starved: int = 0
    #: for each starved waiter: how long it waited, how often the lock changed hands meanwhile
    starvation: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: leases lost because they could not be renewed (renewal_failed, connection_lost)
    renewal_losses: int = 0
    #: of those, how many had not gone at risk first
    unwarned: int = 0
    #: writes through asynclock's fence the store applied, refused, and refused before any I/O
    fenced: int = 0
    fenced_refused: int = 0
    fenced_lost: int = 0

    @property
    def operations(self) -> int:
        return self.sections + self.cancelled_ops + self.unavailable

    def merge(self, other: Verdict) -> None:
        self.sections += other.sections
        self.cancelled_ops += other.cancelled_ops
        self.unavailable += other.unavailable
        self.losses += other.losses
        self.refused += other.refused
        self.accepted_writes += other.accepted_writes
        self.overlaps_allowed += other.overlaps_allowed
        self.late_cancels += other.late_cancels
        self.dead_on_arrival += other.dead_on_arrival
        self.starved += other.starved
        self.starvation += other.starvation
        self.violations += other.violations
        self.renewal_losses += other.renewal_losses
        self.unwarned += other.unwarned
        self.fenced += other.fenced
        self.fenced_refused += other.fenced_refused
        self.fenced_lost += other.fenced_lost


def check(
    logs: Sequence[WorkerLog],
    store: StoreState,
    stale: Iterable[StaleWindow] = (),
    *,
    killed: Iterable[int] = (),
    tokens: bool = True,
) -> Verdict:
    """Check every invariant over a finished run; ``killed``: indexes of workers killed on purpose;
    ``tokens``: whether the backend gives fencing tokens (without, there is no order to check)."""
    stale = list(stale)
    killed = set(killed)
    verdict = Verdict()
    sections: list[Section] = []
    for log in logs:
        sections += log.sections
        verdict.cancelled_ops += log.cancelled
        verdict.unavailable += log.unavailable
        verdict.violations += [f"worker {log.index}: {what}" for what in log.violations]
        verdict.violations += [f"worker {log.index}: section failed: {what}" for what in log.failed]
        if not log.done and log.index not in killed:
            verdict.violations.append(f"worker {log.index} did not finish its run")
        if log.open_starts:
            verdict.violations.append(f"worker {log.index}: sections without an end {sorted(log.open_starts)}")
        for at, loss, warned in log.lost:
            if loss in RENEWAL_LOSSES:
                verdict.renewal_losses += 1
                # (a lease past its deadline, or just short of it, when its body started had no renewal
                # to warn of: its grant was answered late)
                of = max((s for s in log.sections if s.start <= at), key=lambda s: s.start, default=None)
                late = of is not None and of.deadline is not None and of.start > of.deadline - LATE_GRANT * SCALE
                verdict.unwarned += not warned and not late
    sections.sort(key=lambda s: s.start)
    verdict.sections = len(sections)
    verdict.losses = sum(1 for s in sections if s.outcome == "lost")

    def exposed(section: Section) -> bool:
        return section.dead_on_arrival or any(window.exposes(section) for window in stale)

    verdict.dead_on_arrival = sum(1 for s in sections if s.dead_on_arrival)

    # 1 and 2: overlaps and token order
    slack = LATE_CANCEL_SLACK * SCALE
    for i, first in enumerate(sections):
        end = first.exclusive_end(slack)
        verdict.late_cancels += end < first.end
        for second in sections[i + 1 :]:
            if second.start >= end:
                break
            if exposed(first):
                verdict.overlaps_allowed += 1
            else:
                verdict.violations.append(
                    f"overlap: worker {first.worker} section {first.sid} [{first.start:.4f}, {first.end:.4f}] "
                    f"(deadline {first.deadline}) "
                    f"token {first.token} and worker {second.worker} section {second.sid} started "
                    f"{second.start:.4f} token {second.token}"
                )
    for before, after in itertools.pairwise(sections if tokens else []):
        if after.token <= before.token:
            verdict.violations.append(
                f"token order: worker {before.worker} section {before.sid} started {before.start:.4f} with token "
                f"{before.token}, then worker {after.worker} section {after.sid} at {after.start:.4f} "
                f"with token {after.token}"
            )

    # liveness of a non-fair lock: a waiter past its bound is starved, not stuck,
    # if the lock kept changing hands meanwhile (others started sections)
    for log in logs:
        for asked, given_up, what in log.stuck:
            others = sum(1 for s in sections if s.worker != log.index and asked <= s.start <= given_up)
            if others >= STARVED_HANDOVERS:
                verdict.starved += 1
                verdict.starvation.append(
                    f"worker {log.index} waited {given_up - asked:.1f}s while others took the lock {others} times "
                    f"({what.split('; tasks:')[0]})"
                )
            else:
                verdict.violations.append(
                    f"worker {log.index}: {what}; the lock changed hands only {others} times meanwhile"
                )

    # 3: the store
    verdict.accepted_writes = store.accepted_writes
    verdict.refused = store.refused
    if store.counter != store.accepted_writes:
        verdict.violations.append(f"lost update: counter {store.counter} after {store.accepted_writes} accepted writes")
    accepted = [token for _, token, _ in store.log]
    if any(b < a for a, b in itertools.pairwise(accepted)):
        verdict.violations.append("the store accepted an operation with a lower token than an earlier one")
    recorded_ok = sum(1 for s in sections if s.write == "ok")
    unknown = sum(1 for s in sections if s.write in ("sent", "?") or s.read in ("sent", "?"))
    if not recorded_ok <= store.accepted_writes <= recorded_ok + unknown:
        verdict.violations.append(
            f"the workers saw {recorded_ok} accepted writes (+{unknown} unknown), the store {store.accepted_writes}"
        )

    # 4: refusals
    refused_sections = [s for s in sections if "refused" in (s.read, s.write)]
    for section in refused_sections:
        if not exposed(section):
            verdict.violations.append(
                f"refused op from worker {section.worker} section {section.sid} (token {section.token}) "
                "outside any stale window"
            )

    # 7: fenced writes
    check_fenced(sections, store, exposed, verdict)
    return verdict


def check_fenced(
    sections: Sequence[Section], store: StoreState, exposed: Callable[[Section], bool], verdict: Verdict
) -> None:
    """Invariant 7: no stale fenced write applied, refusals only where expected, accounts agree."""
    outcomes = [s.fenced for s in sections] + [s.late for s in sections]
    verdict.fenced = len(store.fenced)
    verdict.fenced_refused = outcomes.count("refused")
    verdict.fenced_lost = outcomes.count("lost")
    newest: tuple[int, str] | None = None
    for token, who in store.fenced:
        if newest is not None and token < newest[0]:
            verdict.violations.append(
                f"a fenced write from a stale holder was applied: token {token} ({who}) "
                f"after token {newest[0]} ({newest[1]}) had written"
            )
        if newest is None or token > newest[0]:
            newest = (token, who)
    for section in sections:
        if section.fenced == "refused" and not exposed(section):
            verdict.violations.append(
                f"fenced write refused from worker {section.worker} section {section.sid} (token {section.token}) "
                "outside any stale window"
            )
    applied = outcomes.count("ok")
    unknown = outcomes.count("sent") + outcomes.count("?")
    if not applied <= len(store.fenced) <= applied + unknown:
        verdict.violations.append(
            f"the workers saw {applied} fenced writes applied (+{unknown} unknown), the store {len(store.fenced)}"
        )
