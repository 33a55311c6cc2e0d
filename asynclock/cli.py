"""The ``asynclock`` command.

``asynclock inspect URL [NAME ...] [--json] [--timeout S]`` prints who holds
which lock. ``asynclock break URL NAME [--yes]`` force-releases a stuck lock
(it shows the holder and asks first). ``asynclock demo`` shows, as a live timeline, workers contending
for one lock: handoffs, fencing tokens, watchdog renewals, a holder that dies
and a lease taken away from its holder. ``asynclock --version`` prints the
version. Run ``asynclock COMMAND --help`` for a command's options.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from . import __version__
from ._options import mask_secrets

#: The command the demo's worker processes run; not listed by ``--help``.
_WORKER_COMMAND = "demo-worker"


def _seconds_between(low: float, high: float, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be between {low:g} and {high:g} seconds, got {text}")
        return value

    return parse


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the number of workers must be a whole number, got {text!r}") from None
    if not 2 <= value <= 8:
        raise argparse.ArgumentTypeError(f"the number of workers must be between 2 and 8, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with messages that name only what a user can type."""

    def error(self, message: str) -> NoReturn:
        # A missing URL makes argparse call inspect's optional NAMEs required too.
        if self.prog.endswith(" inspect"):
            message = message.replace("required: URL, NAME", "required: URL")
        # An unknown command lists the public ones only.
        message = message.replace(f", '{_WORKER_COMMAND}'", "")
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asynclock", description="asyncio-native distributed locks.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

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
    demo.add_argument(
        "--ttl", type=_seconds_between(0.2, 60, "the ttl"), default=2.0, help="lease time in seconds (default: 2)"
    )
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
    inspect.add_argument("url", metavar="URL", help="lock server URL, e.g. redis://127.0.0.1:6379/0")
    inspect.add_argument("names", nargs="*", metavar="NAME", help="lock names (default: every held lock)")
    inspect.add_argument("--prefix", help="key prefix the application uses (default: asynclock)")
    inspect.add_argument("--json", action="store_true", help="JSON instead of a table")
    inspect.add_argument(
        "--kind",
        choices=("lock", "fair", "rw", "semaphore", "election"),
        default="lock",
        help="which primitive the names are (default: lock); HOLDER shows one holder and how many more"
        " (an election's: the leader's identity)",
    )
    inspect.add_argument(
        "--timeout",
        type=_seconds_between(0.01, 3600, "the timeout"),
        default=5.0,
        help="give up (exit status 1) if the server has not answered within this many seconds (default: 5)",
    )

    breaking = commands.add_parser(
        "break",
        help="force-release a stuck lock: show its holder, ask, and break it",
        description=(
            "Force-release the lock NAME, whoever holds it: its holder's body is cancelled when it finds out"
            " (at its next renewal at the latest) and the next holder gets a larger fencing token. Shows the"
            " holder first and asks; with no terminal to ask on it refuses unless --yes is given. Exit status:"
            " 0 broken (or not held), 1 an error, 2 a wrong command line, 3 not broken (not confirmed, or the"
            " lock changed hands since it was shown)."
        ),
    )
    breaking.add_argument("url", metavar="URL", help="lock server URL, e.g. redis://127.0.0.1:6379/0")
    breaking.add_argument("name", metavar="NAME", help="the lock's name")
    breaking.add_argument("--yes", action="store_true", help="break it without asking")
    breaking.add_argument("--prefix", help="key prefix the application uses (default: asynclock)")
    breaking.add_argument(
        "--timeout",
        type=_seconds_between(0.01, 3600, "the timeout"),
        default=10.0,
        help="give up (exit status 1) if the server has not answered within this many seconds (default: 10)",
    )

    # Without help=, argparse leaves it out of the command list.
    worker = commands.add_parser(_WORKER_COMMAND)
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
            table = snapshot(
                args.url, args.names, prefix=args.prefix, json_output=args.json, kind=args.kind, timeout=args.timeout
            )
        except (LockError, ValueError, TypeError, OSError, NotImplementedError) as exc:
            print(f"asynclock inspect: {mask_secrets(str(exc), args.url)}", file=sys.stderr)
            return 1
        print(table)
        return 0
    if args.command == "break":
        from ._errors import LockError
        from ._operator import FAILED, run_break

        try:
            return run_break(args.url, args.name, prefix=args.prefix, yes=args.yes, timeout=args.timeout)
        except (LockError, ValueError, TypeError, OSError, NotImplementedError) as exc:
            print(f"asynclock break: {mask_secrets(str(exc), args.url)}", file=sys.stderr)
            return FAILED
    if args.command == _WORKER_COMMAND:
        from ._demo import run_worker_process

        return run_worker_process(args.id, args.url, prefix=args.prefix, ttl=args.ttl, seed=args.seed)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
