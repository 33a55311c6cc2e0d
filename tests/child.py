"""A child Python process that a test drives line by line (a holder to SIGKILL, a waiter elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Self

from tests.servers import scaled


class ChildProcess:
    """Runs ``python -c script args…``; the script prints ``started`` first, then lines the test reads."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, script: str, *args: str) -> Self:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        child = cls(proc)
        assert await child.line() == "started"
        return child

    async def line(self) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(scaled(30)):
            return (await self.proc.stdout.readline()).decode().strip()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        async with asyncio.timeout(scaled(30)):
            return await self.proc.wait()


@contextlib.asynccontextmanager
async def children() -> AsyncIterator[list[ChildProcess]]:
    """A list to put started children in; every one is killed (and reaped) on leaving."""
    started: list[ChildProcess] = []
    try:
        yield started
    finally:
        for child in started:
            child.kill()
            with contextlib.suppress(Exception):
                await child.wait()


#: A candidate of the election "e" in a process of its own: argv url, prefix, ttl, identity; prints
#: "started", then "leading <token>" when it leads (and holds on), or "lost" when its term is lost.
CANDIDATE = """
import asyncio, sys
import asynclock

async def main(url, prefix, ttl, identity):
    async with asynclock.connect(url, ttl=float(ttl), prefix=prefix) as locks:
        print("started", flush=True)
        try:
            async with locks.election("e", identity=identity).leadership() as term:
                print("leading", term.token, flush=True)
                await asyncio.sleep(3600)
        except asynclock.LockLost:
            print("lost", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""
