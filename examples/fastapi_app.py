"""A FastAPI app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app

``POST /jobs/{name}`` runs the job ``name`` while holding the lock
``job:{name}``: two requests for the same job, on any of the app's processes,
run one after the other; the second one waits for the first.
"""

from __future__ import annotations

import asyncio
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
async def run_job(name: str, request: Request, seconds: float = 1.0) -> dict[str, Any]:
    locks: asynclock.Locks = request.app.state.locks
    asked = time.monotonic()
    try:
        async with locks.lock(f"job:{name}") as lease:
            waited = time.monotonic() - asked
            await build_report(name, lease.token, seconds)
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now.
        raise HTTPException(status_code=503, detail=str(exc)) from exc
    return {"job": name, "token": lease.token, "waited_s": round(waited, 3)}
