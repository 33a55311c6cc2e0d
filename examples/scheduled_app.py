"""A FastAPI app whose replicas all schedule one job every minute, and exactly one of them runs it.

Run several replicas against one lock server::

    ASYNCLOCK_URL=zk://127.0.0.1:2181 uvicorn examples.scheduled_app:app --port 8001
    ASYNCLOCK_URL=zk://127.0.0.1:2181 uvicorn examples.scheduled_app:app --port 8002

Every replica's scheduler calls ``digest`` at the start of every minute (by
the wall clock, so the replicas call it at about the same time).
``@locks.singleton`` lets one call run it: the others find its lock held and
skip. ``at_least`` (half the period) keeps the lock held after a quick run,
so a replica whose clock or event loop is a little late does not run the
job again for the same minute; ``at_most`` (the period) cancels a run that
would overlap the next one. ``GET /runs`` shows which minutes this replica
ran and which it skipped. ``JOB_PERIOD`` (seconds, default 60) changes the
period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

import asynclock

log = logging.getLogger("scheduled_app")

PERIOD = float(os.environ.get("JOB_PERIOD", "60"))


async def send_digest(due: float) -> None:
    """The job (a stand-in: put yours here)."""
    log.info("digest for %s", time.strftime("%H:%M:%S", time.localtime(due)))


async def schedule(digest: asynclock.Singleton[[float], None], runs: dict[str, list[float]]) -> None:
    """Call the job at the start of every period, on every replica; the singleton decides who runs it."""
    while True:
        due = (time.time() // PERIOD + 1) * PERIOD
        await asyncio.sleep(due - time.time())
        try:
            outcome = await digest.attempt(due)
        except (asynclock.LockError, TimeoutError) as exc:  # the lock server away, a run cut off or lost
            log.warning("digest for %s failed: %r", due, exc)
            continue
        runs["ran" if outcome.ran else "skipped"].append(due)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client for the app's lifetime: it owns the connections and the lease watchdog.
    async with asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://")) as locks:

        @locks.singleton("digest", at_most=PERIOD, at_least=PERIOD / 2)
        async def digest(due: float) -> None:
            await send_digest(due)

        app.state.runs = {"ran": [], "skipped": []}
        scheduler = asyncio.create_task(schedule(digest, app.state.runs))
        try:
            yield
        finally:
            scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scheduler


app = FastAPI(lifespan=lifespan)


@app.get("/runs")
async def runs(request: Request) -> dict[str, Any]:
    """The periods (their start, in seconds since the epoch) this replica ran the job for, and skipped."""
    return {"pid": os.getpid(), **request.app.state.runs}
