"""A FastAPI app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app

``POST /jobs/{name}`` runs the job ``name`` while holding the lock
``job:{name}``: two requests for the same job, on any of the app's processes,
run one after the other; the second one waits for the first, for at most
``wait`` seconds (default 10): then it gets a 503 with ``Retry-After``, as it
does when the lock service stays unavailable for the wait. A job whose lease
is lost while it runs is cancelled and answered with a 503 that says so.

Its tests (tests/test_examples.py) run it on asynclock's testing kit: the
``locks`` fixture as ``app.state.locks``, with no server and no lifespan.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

import asynclock


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client for the app's lifetime: it owns the connections and the lease watchdog.
    async with asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://")) as locks:
        app.state.locks = locks
        yield


app = FastAPI(lifespan=lifespan)


async def build_report(name: str, fencing_token: int | None, seconds: float) -> None:
    """The work the lock protects (a stand-in: put yours here).

    Pass ``fencing_token`` along to whatever you write to, so that it can
    refuse a writer whose lease was lost in the meantime.
    """
    await asyncio.sleep(seconds)


@app.post("/jobs/{name}")
async def run_job(name: str, request: Request, seconds: float = 1.0, wait: float = 10.0) -> dict[str, Any]:
    locks: asynclock.Locks = request.app.state.locks
    lock = locks.lock(f"job:{name}")
    come_back = {"Retry-After": str(max(1, math.ceil(wait)))}
    asked = time.monotonic()
    try:
        lease = await lock.acquire(timeout=wait)
    except asynclock.LockTimeout:
        # Another process has run this job for the whole wait: tell the client when to come back.
        raise HTTPException(503, f"job {name!r} is running elsewhere", headers=come_back) from None
    except asynclock.BackendUnavailable as exc:
        # The lock service did not answer for the whole wait: nobody can tell who runs the job.
        detail = f"job {name!r} cannot run now: the lock service is unavailable"
        raise HTTPException(503, detail, headers=come_back) from exc
    waited = time.monotonic() - asked
    try:
        async with lock:  # re-enters the hold: the job runs in the lease's cancel scope
            await build_report(name, lease.token, seconds)
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now.
        raise HTTPException(status_code=503, detail=f"job {name!r} stopped: {exc}") from exc
    finally:
        if lock.held:  # (not held any more if the lease was lost)
            await lock.release()  # undoes the acquire
    return {"job": name, "token": lease.token, "waited_s": round(waited, 3)}
