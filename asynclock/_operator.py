"""``asynclock break URL NAME [--yes]``: show who holds a lock, ask, and break it.

The holder is shown first (as ``asynclock inspect`` shows it). Without
``--yes`` the command asks on the terminal, and with no terminal to ask on
it refuses and changes nothing. The break takes only the hold that was
shown: if the lock changed hands meanwhile, nothing is broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TextIO

from ._connect import connect
from ._errors import BackendUnavailable
from ._inspect import as_table, collect
from ._options import mask_url
from ._values import LockInfo

__all__ = ["BROKEN", "FAILED", "NOT_BROKEN", "run_break"]

#: Exit statuses: broken (or nothing to break), an error, not broken (not confirmed, or it changed hands).
#: (2 is argparse's: the command line was wrong.)
BROKEN, FAILED, NOT_BROKEN = 0, 1, 3


def run_break(
    url: str,
    name: str,
    *,
    prefix: str | None,
    yes: bool,
    timeout: float,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Show the holder of ``name``, ask (unless ``yes``), break it; the exit status."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    (shown,) = asyncio.run(collect(url, [name], prefix=prefix, timeout=timeout))
    if shown.owner is None:
        print(f"lock {name!r} is not held: nothing to break", file=stdout)
        return BROKEN
    print(as_table([shown]), file=stdout)
    if not yes:
        if not stdin.isatty():
            print(
                "asynclock break: not broken: there is no terminal to ask on; add --yes to break it without asking",
                file=sys.stderr,
            )
            return NOT_BROKEN
        print(f"Break lock {name!r}, held by {shown.owner}? [y/N] ", end="", file=stdout, flush=True)
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("not broken", file=stdout)
            return NOT_BROKEN
    broken = asyncio.run(_break(url, name, shown.owner, prefix=prefix, timeout=timeout))
    if broken is None:
        print(f"lock {name!r} was released or changed hands since it was shown: not broken", file=stdout)
        return NOT_BROKEN
    token = "" if broken.token is None else f" (token {broken.token})"
    print(
        f"broken: lock {name!r} was taken from {broken.owner}{token}; that holder's body is cancelled when it"
        " finds out, at its next renewal at the latest, and the next holder gets a larger token",
        file=stdout,
    )
    return BROKEN


async def _break(url: str, name: str, owner: str, *, prefix: str | None, timeout: float) -> LockInfo | None:
    locks = connect(url, prefix=prefix, connect_timeout=timeout)
    try:
        async with asyncio.timeout(timeout), locks:
            return await locks.break_lock(name, owner=owner)
    except TimeoutError:
        raise BackendUnavailable(f"{mask_url(url)} did not answer within {timeout:g} s") from None
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await locks.aclose()
