"""The ``asynclock`` command.

``asynclock inspect URL [NAME ...] [--json]`` prints who holds which lock.
``asynclock demo`` shows, as a live timeline, workers contending for one lock:
handoffs, fencing tokens, watchdog renewals, a holder that dies and a lease
taken away from its holder. Run ``asynclock demo --help`` for its options.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence


def _ttl(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or not 0.2 <= value <= 60:
        raise argparse.ArgumentTypeError("the ttl must be between 0.2 and 60 seconds")
    return value


def _workers(text: str) -> int:
    value = int(text)
    if not 2 <= value <= 8:
        raise argparse.ArgumentTypeError("between 2 and 8 workers")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asynclock", description="asyncio-native distributed locks.")
    # The metavar lists the public commands only; demo-worker is the demo's own helper.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="watch workers contend for one lock, a holder die and a lease get lost",
        description=(
            "Workers (processes, when a server is used) contend for one lock while a timeline shows each"
            " acquisition with its fencing token, each handoff and its latency, the watchdog's renewals,"
            " a holder that is killed (the lock comes back after the ttl) and a lease deleted behind its"
            " holder's back (its work is cancelled with LockLost). Takes about 20 seconds."
        ),
    )
    demo.add_argument(
        "--url",
        help="lock server to use, e.g. redis://127.0.0.1:6379/0 (default: a throwaway redis-server"
        " from PATH, else memory://)",
    )
    demo.add_argument("--ttl", type=_ttl, default=2.0, help="lease time in seconds (default: 2)")
    demo.add_argument("--workers", type=_workers, default=3, help="number of workers (default: 3)")
    demo.add_argument("--no-color", action="store_true", help="plain text even on a terminal")

    inspect = commands.add_parser(
        "inspect",
        help="show who holds locks: holder, hold count, remaining ttl, waiters, token",
        description=(
            "Ask the lock server about locks, including those held by other processes. With no NAME,"
            " list every lock held under the prefix (on backends that can list them)."
        ),
    )
    inspect.add_argument("url", help="lock server URL, e.g. redis://127.0.0.1:6379/0")
    inspect.add_argument("names", nargs="*", metavar="NAME", help="lock names (default: every held lock)")
    inspect.add_argument("--prefix", help="key prefix the application uses (default: asynclock)")
    inspect.add_argument("--json", action="store_true", help="JSON instead of a table")
    inspect.add_argument(
        "--kind",
        choices=("lock", "fair", "rw", "semaphore"),
        default="lock",
        help="which primitive the names are (default: lock); HOLDER shows one holder and how many more",
    )

    worker = commands.add_parser("demo-worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--prefix", required=True)
    worker.add_argument("--ttl", type=float, required=True)
    worker.add_argument("--id", required=True)
    worker.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asynclock`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        return run_demo(args.url, ttl=args.ttl, workers=args.workers, color=color)
    if args.command == "inspect":
        from ._errors import LockError
        from ._inspect import snapshot

        try:
            print(snapshot(args.url, args.names, prefix=args.prefix, json_output=args.json, kind=args.kind))
        except (LockError, ValueError, TypeError, OSError, NotImplementedError) as exc:
            print(f"asynclock inspect: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "demo-worker":
        from ._demo import run_worker_process

        return run_worker_process(args.id, args.url, prefix=args.prefix, ttl=args.ttl, seed=args.seed)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
