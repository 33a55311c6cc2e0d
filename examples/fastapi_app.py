"""A FastAPI app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app

``POST /jobs/{name}`` runs the job ``name`` while holding the lock
``job:{name}``: two requests for the same job, on any of the app's processes,
run one after the other; the second one waits for the first, for at most
``wait`` seconds (default 10): then it gets a 503 with ``Retry-After``, as it
does when the lock service stays unavailable for the wait. A job whose lease
is lost while it runs is cancelled and answered with a 503 that says so, and
that its outcome is unknown: what it did before the loss may have happened.
``GET /healthz`` answers 200 while the lock service answers, 503 otherwise.
On shutdown the app drains: running jobs get 10 s to finish, then every lock
goes to another process.

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

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

import asynclock


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client for the app's lifetime: it owns the connections and the lease watchdog.
    locks = asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://"))
    await locks.open()  # a lock service that is not there fails the start-up, not the first request
    app.state.locks = locks
    try:
        yield
    finally:
        # Running jobs get 10 s to finish; then every lock is handed to the next process.
        await locks.aclose(drain=10)


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
        # Wait at most `wait` seconds; the job then runs in the lease's cancel scope.
        async with lock.acquire(timeout=wait) as lease:
            waited = time.monotonic() - asked
            await build_report(name, lease.token, seconds)
    except asynclock.LockTimeout:
        # Another process has run this job for the whole wait: tell the client when to come back.
        raise HTTPException(503, f"job {name!r} is running elsewhere", headers=come_back) from None
    except asynclock.BackendUnavailable as exc:
        # The lock service did not answer for the whole wait: nobody can tell who runs the job.
        detail = f"job {name!r} cannot run now: the lock service is unavailable"
        raise HTTPException(503, detail, headers=come_back) from exc
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now. What it
        # wrote before may have happened, so the client must not simply retry: the outcome is unknown.
        raise HTTPException(503, f"job {name!r} stopped, outcome unknown: {exc}") from exc
    return {"job": name, "token": lease.token, "waited_s": round(waited, 3)}


@app.get("/healthz")
async def healthz(request: Request) -> Response:
    health = await request.app.state.locks.health()
    body = {"ok": health.ok, "latency_s": health.latency, "held": health.held, "error": health.error}
    return JSONResponse(body, status_code=200 if health.ok else 503)
