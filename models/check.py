"""Checks the SPIN models of this directory: every property of every model, and every mutant.

A model is checked by SPIN's own verifier: ``spin -a`` writes it as a C
program (``pan.c``), gcc compiles that, and ``./pan`` searches every state the
model can reach. The search is exhaustive (no bitstate hashing); a search cut
short (the depth limit, memory) counts as a failure, never as a pass.

* A *property* run must end with 0 errors, a search not cut short, and at
  least ``MIN_STATES`` states stored. The safety run (``SAFETY``) checks the
  model's assertions and its end states (no deadlock); a liveness run checks
  one ``ltl`` formula, built with ``-DLIVENESS``, under weak fairness
  (``pan -a -f -N <formula>``).
* A *mutant* is a ``#ifdef MUTANT_<NAME>`` block of the model that puts a
  real bug back. Its run must find an error of the expected kind, with a
  trail (``<model>.pml.trail``, replayed by ``spin -t -p``).

Run it from anywhere (spin and gcc must be on the PATH)::

    python models/check.py                      # every model, property and mutant
    python models/check.py redis_lock           # one model
    python models/check.py redis_lock --keep    # and keep its build directories (trails)

``tests/test_models.py`` runs the same catalogue in the test suite.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Fewest states a property run must store: a smaller search proves too little.
MIN_STATES = 10_000
#: pan's search depth limit (-m): far above any model's depth, so reaching it is a bug of the model.
DEPTH = 1_000_000
#: pan's hash table: 2^HASH slots (exhaustive either way: this only sizes the table).
HASH = 20
#: Most memory one pan may use, in MB: a model that outgrows it fails ("out of memory"), never swaps.
MEMORY_MB = 1024
#: How much lower than the caller's the priority of spin, gcc and pan is (``os.nice``): the test
#: suite raises it, so that tests that measure time beside a model check keep the CPU first.
NICENESS = 0

#: gcc's optimisation of pan.c: none. These models are small enough that compiling pan.c
#: well (seconds) costs more than it saves on the search.
OPTIMISE = "-O0"

#: What pan prints when its search was cut short: the result proves nothing then.
TRUNCATED = (
    "max search depth too small",
    "Search not completed",
    "Search incomplete",
    "out of memory",
    "exceeds memory limit",
    "VECTORSZ too small",
    "stack incomplete",
)

#: The kinds of error a mutant may be caught with, as pan reports them.
ASSERTION = "assertion violated"
ACCEPTANCE = "acceptance cycle"
DEADLOCK = "invalid end state"


@dataclass(frozen=True)
class Property:
    """One run of a model: ``SAFETY`` (assertions, deadlocks), or an ``ltl`` formula of its liveness build."""

    name: str
    #: the ltl formula's name (None: the safety run)
    ltl: str | None = None
    #: what it shows, for the README and the test's messages
    says: str = ""

    @property
    def defines(self) -> tuple[str, ...]:
        return () if self.ltl is None else ("LIVENESS",)


SAFETY = "safety"


@dataclass(frozen=True)
class Mutant:
    """A change that must be caught: a bug put back (``-DMUTANT_<name>``), or, with
    ``assumption``, one of the model's assumptions dropped (``-D<name>``), which shows
    what the code does not guarantee without it. ``caught_by`` names the property whose
    run must find it, ``error`` the kind of error pan must report first."""

    name: str
    caught_by: str
    error: str
    says: str
    assumption: bool = False

    @property
    def define(self) -> str:
        return self.name if self.assumption else f"MUTANT_{self.name}"


@dataclass(frozen=True)
class Model:
    """A model file, its properties and its mutants."""

    name: str
    properties: tuple[Property, ...]
    mutants: tuple[Mutant, ...]

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.pml"

    def property(self, name: str) -> Property:
        return next(prop for prop in self.properties if prop.name == name)


@dataclass
class Result:
    """What one run of pan said."""

    errors: int
    states: int
    depth: int
    truncated: list[str]
    first_error: str
    trail: bool
    seconds: float
    output: str = field(repr=False)

    def describe(self) -> str:
        cut = f", cut short: {'; '.join(self.truncated)}" if self.truncated else ""
        error = f", first: {self.first_error}" if self.first_error else ""
        return f"{self.errors} errors, {self.states} states, depth {self.depth}{cut}{error} ({self.seconds:.1f} s)"


def _safety(says: str) -> Property:
    return Property(SAFETY, says=says)


def _served(says: str) -> Property:
    return Property("served", ltl="served", says=says)


#: The client side of a queued Redis hold (``backends/redis/_queue.py``), which the lock and the
#: read-write lock share, trusting a stale hand-over message.
STALE_HANDOVER = Mutant(
    "STALE_HANDOVER",
    SAFETY,
    ASSERTION,
    "a hand-over message that arrived while a poll was out is trusted after the poll said 'queued'",
)

MODELS: tuple[Model, ...] = (
    Model(
        "redis_lock",
        (
            _safety(
                "whoever is inside its body is the server's holder, with its token; tokens strictly increase; a"
                " newcomer never takes the lock ahead of a live waiter; a cancelled acquire leaves no grant and no"
                " queue entry; no deadlock"
            ),
            _served("a waiter is served while the others keep taking, releasing and cancelling"),
        ),
        (
            Mutant(
                "RELEASE_NO_OWNER_CHECK",
                SAFETY,
                ASSERTION,
                "a release frees X whoever holds it: a late release frees the next holder's lock",
            ),
            Mutant(
                "TRUST_SERVER_EXPIRY",
                SAFETY,
                ASSERTION,
                "the deadline counted from the answer's arrival: the body outlives the server's expiry",
            ),
            Mutant(
                "NO_DRIFT_MARGIN",
                SAFETY,
                ASSERTION,
                "a deadline of the whole ttl: a slow client clock outlives the server's expiry",
            ),
            STALE_HANDOVER,
            Mutant(
                "NO_TIME_FLOOR",
                SAFETY,
                ASSERTION,
                "tokens start again from 1 once X expired: a later holder gets a smaller token",
            ),
            Mutant(
                "JUMP_EXPIRED_QUEUE",
                SAFETY,
                ASSERTION,
                "a newcomer takes an expired lock ahead of the queue that waited for it",
            ),
            Mutant(
                "NO_QUEUE_FLAG",
                SAFETY,
                ASSERTION,
                "a queued waiter does not flag X: the holder's release frees it instead of handing it over",
            ),
            Mutant(
                "POLL_MISSES_HANDOVER",
                "served",
                ACCEPTANCE,
                "a poll does not see that the lock was handed to it: a lost message strands the waiter",
            ),
            Mutant(
                "LATE_MESSAGES",
                SAFETY,
                ASSERTION,
                "hand-over messages may arrive any time later (no pub/sub health check): a grant that"
                " expired unseen is taken for the waiter's own",
                assumption=True,
            ),
        ),
    ),
    Model(
        "redis_queue",
        (
            _safety(
                "the live holders are one writer or readers only; whoever is inside its body is a live holder,"
                " with its token; tokens strictly increase; a newcomer never gets in ahead of a live waiter (a"
                " queued writer keeps later readers out); a cancelled acquire leaves no grant and no queue"
                " entry; no deadlock"
            ),
            _served("a reader is served while the other client keeps writing, reading and cancelling"),
        ),
        (
            Mutant("READER_JOINS_ANYBODY", SAFETY, ASSERTION, "a reader joins whoever holds, a writer too"),
            Mutant(
                "NEWCOMER_IGNORES_QUEUE",
                SAFETY,
                ASSERTION,
                "a newcomer that fits takes it with a writer queued: readers overtake a waiting writer",
            ),
            STALE_HANDOVER,
            Mutant(
                "POLL_MISSES_GRANT",
                "served",
                ACCEPTANCE,
                "a poll does not see the grant a hand-over made it: a lost message strands the waiter",
            ),
        ),
    ),
    Model(
        "redlock",
        (_safety("at most one client is inside its body, with one node of three crashing (back after a ttl)"),),
        (
            Mutant("NO_QUORUM", SAFETY, ASSERTION, "one node's yes is taken for the lock"),
            Mutant(
                "VALIDITY_FROM_ANSWER",
                SAFETY,
                ASSERTION,
                "the validity counted from the last answer, not the send: the body outlives the nodes' keys",
            ),
            Mutant("RENEW_ON_ANY", SAFETY, ASSERTION, "a renewal that reached one node keeps the lease"),
            Mutant(
                "RESTART_AT_ONCE",
                SAFETY,
                ASSERTION,
                "a crashed node comes back empty at once: the holder's majority shrinks and a second client"
                " gets a majority while the first still believes",
                assumption=True,
            ),
            Mutant(
                "CLOCK_JUMP",
                SAFETY,
                ASSERTION,
                "a node's clock jumps and its key expires early: the same",
                assumption=True,
            ),
        ),
    ),
    Model(
        "zookeeper_lock",
        (
            _safety(
                "at most one client (asynclock or Curator) is inside its body, and it is the lowest live"
                " contender; tokens (czxid) strictly increase; a cancelled acquire leaves no node while its"
                " session lives; no deadlock"
            ),
            _served("a waiter is served while the other clients (one of them Curator) keep taking and releasing"),
        ),
        (
            Mutant(
                "PREDECESSOR_GONE_MEANS_HELD",
                SAFETY,
                ASSERTION,
                "a waiter whose watched predecessor goes holds at once, with the holder still ahead",
            ),
            Mutant(
                "ORDER_BY_NAME",
                SAFETY,
                ASSERTION,
                "contenders ordered by the whole name, not the sequence number: Curator and asynclock both hold",
            ),
            Mutant(
                "NO_LEASE_MARGIN",
                SAFETY,
                ASSERTION,
                "the whole session timeout trusted: the body outlives the session's expiry",
            ),
            Mutant(
                "CLEANUP_SKIPS_UNCERTAIN",
                SAFETY,
                ASSERTION,
                "a cancelled acquire whose create answer was lost leaves its node behind",
            ),
            Mutant(
                "NO_REREAD_AFTER_RECONNECT",
                "served",
                ACCEPTANCE,
                "a waiter whose watch went with its connection waits on it for ever",
            ),
        ),
    ),
    Model(
        "etcd_mutex",
        (
            _safety(
                "at most one task is inside its body, and its key is the first by create revision, which is its"
                " token; tokens strictly increase; no deadlock"
            ),
            _served("client 1 is served while client 0's tasks keep taking and releasing, and its lease ends"),
        ),
        (
            Mutant(
                "TRUST_KEEPALIVE_ANSWER",
                SAFETY,
                ASSERTION,
                "the lease counted from the keep-alive's answer, not its send: the body outlives the lease",
            ),
            Mutant(
                "TURN_BEFORE_DELETE",
                SAFETY,
                ASSERTION,
                "the next task's turn starts when the delete is sent: it takes the old key for its own",
            ),
            Mutant(
                "WATCH_GAP",
                "served",
                ACCEPTANCE,
                "no second look after the watch starts: a deletion just before it is missed for ever",
            ),
        ),
    ),
    Model(
        "postgres_sessions",
        (
            _safety(
                "whoever is inside its body holds its key on the server, on the session its client counts it on;"
                " a session's end loses exactly the holds on it; tokens strictly increase; a cancelled acquire"
                " holds nothing and leaves no row; no deadlock"
            ),
            _served("a waiter is served while the other client keeps taking and releasing, and its sessions end"),
        ),
        (
            Mutant(
                "NO_DRIFT_MARGIN",
                SAFETY,
                ASSERTION,
                "a deadline of the whole idle timeout: the body outlives the session",
            ),
            Mutant(
                "LOSE_CLIENTS_HOLDS",
                SAFETY,
                ASSERTION,
                "a session's end loses every hold of the client, on its other sessions too",
            ),
            Mutant(
                "HOLD_NOT_ON_SESSION",
                SAFETY,
                ASSERTION,
                "a hold not recorded on its session: the session's end does not lose it",
            ),
            Mutant(
                "NEWCOMER_IGNORES_MARKER",
                "served",
                ASSERTION,
                "a newcomer takes the key without looking at its marker: it jumps the queue",
            ),
            Mutant(
                "NO_LOOK_AGAIN",
                "served",
                ACCEPTANCE,
                "a waiter waits for notifications only: a holder whose process dies tells nobody",
            ),
            Mutant(
                "KILL_FROM_OUTSIDE",
                SAFETY,
                ASSERTION,
                "a session ended from outside (pg_terminate_backend, a restart) before its idle timeout: its"
                " holder believes until it hears of it, while another takes the key",
                assumption=True,
            ),
        ),
    ),
    Model(
        "multi_lock",
        (
            _safety(
                "whoever is inside its body has every part at the server, single locks of those names"
                " included; an acquire that gives up (timeout, cancellation, before the all-or-none answer)"
                " holds no part and waits in no queue; no deadlock"
            ),
        ),
        (
            Mutant(
                "CALLER_ORDER",
                SAFETY,
                DEADLOCK,
                "the parts taken in the caller's order: multi(['a', 'b']) and multi(['b', 'a']) each hold"
                " one part and wait for the other's",
            ),
            Mutant(
                "NO_GIVE_BACK",
                SAFETY,
                ASSERTION,
                "an acquire that gives up keeps the parts it took before",
            ),
            Mutant(
                "BODY_UNDER_FIRST_PART",
                SAFETY,
                ASSERTION,
                "the body runs under its first part only: another part's loss does not cancel it",
            ),
            Mutant(
                "NO_RECHECK",
                SAFETY,
                ASSERTION,
                "a part lost while the later ones were being taken is not noticed: the body starts without it",
            ),
            Mutant(
                "LOSS_KEEPS_REST",
                SAFETY,
                DEADLOCK,
                "a part's loss ends the body but does not release the other parts: their waiters wait for ever",
            ),
        ),
    ),
    Model(
        "fences",
        (
            _safety(
                "the tokens of the writes a store applies (Redis through RedisFence, PostgreSQL through"
                " PostgresFence) never decrease, whichever holders are paused past their lease; a write is"
                " refused only when the store has seen a newer token"
            ),
        ),
        (
            Mutant(
                "FENCE_LT",
                SAFETY,
                ASSERTION,
                "the fence lets a token through only if it is newer than the mark (< for <=): a holder's"
                " second write is refused though no newer token wrote",
            ),
            Mutant("NO_FENCE", SAFETY, ASSERTION, "no comparison: a paused holder's write lands after a newer one's"),
            Mutant(
                "CHECK_THEN_WRITE",
                SAFETY,
                ASSERTION,
                "Redis: the mark read, then the command sent apart: a newer holder writes in between",
            ),
            Mutant(
                "ADVANCE_APART",
                SAFETY,
                ASSERTION,
                "PostgreSQL: the mark raised in a transaction of its own, not the writes': a newer"
                " holder commits in between",
            ),
        ),
    ),
    Model(
        "mysql_sessions",
        (
            _safety(
                "whoever is inside its body holds its key on the server, on the session its client counts it on;"
                " a session's end loses exactly the holds on it; tokens strictly increase; a cancelled acquire"
                " holds nothing and leaves no wait in the server; no deadlock"
            ),
            _served(
                "a waiter is served while the other client keeps taking and releasing, its sessions end, and"
                " its waits run out and are sent again"
            ),
        ),
        (
            Mutant(
                "ROW_DELETED_AT_RELEASE",
                SAFETY,
                ASSERTION,
                "a release deletes the key's row: the next grant's token starts again from 1",
            ),
            Mutant(
                "GRANT_NOT_ON_SESSION",
                SAFETY,
                ASSERTION,
                "a hold granted through its line is not recorded on the session that waited: that"
                " session's end does not lose it",
            ),
            Mutant(
                "KILL_KEEPS_GRANT",
                SAFETY,
                ASSERTION,
                "the last waiter to leave ends the line's wait, but a key granted to it just before is"
                " not let go of: the session holds it for nobody",
            ),
            Mutant(
                "NO_DRIFT_MARGIN",
                SAFETY,
                ASSERTION,
                "a deadline of the whole wait_timeout: the body outlives the session",
            ),
            Mutant(
                "NO_WAIT_AGAIN",
                "served",
                ACCEPTANCE,
                "a line's wait that ran out in the server is not sent again: its waiter waits for nothing",
            ),
            Mutant(
                "KILL_FROM_OUTSIDE",
                SAFETY,
                ASSERTION,
                "a session ended from outside (KILL, a restart, a failover) before its wait_timeout: its"
                " holder believes until it hears of it, while another takes the key",
                assumption=True,
            ),
        ),
    ),
)


def find(name: str) -> Model:
    for model in MODELS:
        if model.name == name:
            return model
    raise KeyError(f"no model {name!r}: {', '.join(m.name for m in MODELS)}")


def tools() -> str | None:
    """Why the models cannot be checked here (None: they can)."""
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def _number(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else -1


def run(
    model: Model, prop: Property, mutant: Mutant | None = None, workdir: Path | None = None, depth: int = DEPTH
) -> Result:
    """Build and run pan for ``prop`` of ``model`` (with ``mutant`` switched on) in ``workdir``
    (a temporary one), with pan's search depth limit ``depth``."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix=f"spin-{model.name}-") as tmp:
            return run(model, prop, mutant, Path(tmp), depth)
    started = time.monotonic()
    source = workdir / model.path.name
    shutil.copyfile(model.path, source)
    defines = [*prop.defines, *([mutant.define] if mutant else [])]
    _call(["spin", "-a", *(f"-D{d}" for d in defines), source.name], workdir)
    # safety: no never claim, no cycle detection; liveness: room for weak fairness over every process
    flags = ["-DSAFETY", "-DNOCLAIM"] if prop.ltl is None else ["-DNFAIR=5"]
    _call(["gcc", "-w", OPTIMISE, f"-DMEMLIM={MEMORY_MB}", *flags, "-o", "pan", "pan.c"], workdir)
    args = ["./pan", f"-m{depth}", f"-w{HASH}"]
    if prop.ltl is not None:
        args += ["-a", "-f", "-N", prop.ltl]
    done = subprocess.run(
        args, cwd=workdir, capture_output=True, text=True, timeout=600, check=False, preexec_fn=_lower_priority
    )
    output = done.stdout + done.stderr
    first = re.search(r"^pan:1: (.*)$", output, re.M)
    return Result(
        errors=_number(r"errors: (\d+)", output),
        states=_number(r"(\d+) states, stored", output),
        depth=_number(r"depth reached (\d+)", output),
        truncated=[message for message in TRUNCATED if message in output],
        first_error=first.group(1) if first else "",
        trail=(workdir / f"{source.name}.trail").exists(),
        seconds=time.monotonic() - started,
        output=output,
    )


def _lower_priority() -> None:
    if NICENESS:
        os.nice(NICENESS)


def _call(args: list[str], cwd: Path) -> None:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, preexec_fn=_lower_priority
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def verdict(prop: Property, result: Result) -> str | None:
    """Why a property run fails (None: it passes)."""
    if result.truncated:
        return f"search cut short ({'; '.join(result.truncated)})"
    if result.errors != 0:
        return f"{result.errors} errors: {result.first_error}"
    if result.states < MIN_STATES:
        return f"only {result.states} states stored (at least {MIN_STATES})"
    return None


def mutant_verdict(mutant: Mutant, result: Result) -> str | None:
    """Why a mutant run fails (None: the mutant was caught as expected)."""
    if result.errors < 1:
        return "not caught: 0 errors" + (
            f", and the search was cut short ({result.truncated})" if result.truncated else ""
        )
    if mutant.error not in result.first_error:
        return f"caught by another error than '{mutant.error}': {result.first_error}"
    if not result.trail:
        return "no trail written"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the build directories (trails) and print them")
    parser.add_argument("-j", type=int, default=2, help="runs at once (default 2)")
    options = parser.parse_args()
    why = tools()
    if why:
        print(why, file=sys.stderr)
        return 2
    chosen = [find(name) for name in options.models] or list(MODELS)
    jobs: list[tuple[Model, Property, Mutant | None]] = []
    for model in chosen:
        jobs += [(model, prop, None) for prop in model.properties]
        jobs += [(model, model.property(m.caught_by), m) for m in model.mutants]

    def one(job: tuple[Model, Property, Mutant | None]) -> tuple[str, str | None, Result]:
        model, prop, mutant = job
        workdir = Path(tempfile.mkdtemp(prefix=f"spin-{model.name}-"))
        try:
            result = run(model, prop, mutant, workdir)
        finally:
            if not options.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        label = f"{model.name} {prop.name}" + (f" {mutant.define}" if mutant else "")
        if options.keep:
            label += f" [{workdir}]"
        return label, mutant_verdict(mutant, result) if mutant else verdict(prop, result), result

    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, options.j)) as pool:
        for label, failure, result in pool.map(one, jobs):
            failed += failure is not None
            print(
                f"{'FAIL' if failure else 'ok  '} {label}: {result.describe()}"
                + (f"\n     {failure}" if failure else "")
            )
    print(f"{len(jobs) - failed} of {len(jobs)} runs as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
