"""An aiohttp app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py

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
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator

from aiohttp import web

import asynclock

LOCKS = web.AppKey("locks", asynclock.Locks)


async def lock_client(app: web.Application) -> AsyncIterator[None]:
    # One client for the app's lifetime: it owns the connections and the lease watchdog.
    locks = asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://"))
    await locks.open()  # a lock service that is not there fails the start-up, not the first request
    app[LOCKS] = locks
    try:
        yield
    finally:
        # Running jobs get 10 s to finish; then every lock is handed to the next process.
        await locks.aclose(drain=10)


async def build_report(name: str, fencing_token: int | None, seconds: float) -> None:
    """The work the lock protects (a stand-in: put yours here).

    Pass ``fencing_token`` along to whatever you write to, so that it can
    refuse a writer whose lease was lost in the meantime.
    """
    await asyncio.sleep(seconds)


async def run_job(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    seconds = float(request.query.get("seconds", "1.0"))
    wait = float(request.query.get("wait", "10.0"))
    lock = request.app[LOCKS].lock(f"job:{name}")
    come_back = {"Retry-After": str(max(1, math.ceil(wait)))}
    asked = time.monotonic()
    try:
        # Wait at most `wait` seconds; the job then runs in the lease's cancel scope.
        async with lock.acquire(timeout=wait) as lease:
            waited = time.monotonic() - asked
            await build_report(name, lease.token, seconds)
    except asynclock.LockTimeout:
        # Another process has run this job for the whole wait: tell the client when to come back.
        raise web.HTTPServiceUnavailable(text=f"job {name!r} is running elsewhere", headers=come_back) from None
    except asynclock.BackendUnavailable as exc:
        # The lock service did not answer for the whole wait: nobody can tell who runs the job.
        raise web.HTTPServiceUnavailable(
            text=f"job {name!r} cannot run now: the lock service is unavailable", headers=come_back
        ) from exc
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now. What it
        # wrote before may have happened, so the client must not simply retry: the outcome is unknown.
        raise web.HTTPServiceUnavailable(text=f"job {name!r} stopped, outcome unknown: {exc}") from exc
    return web.json_response({"job": name, "token": lease.token, "waited_s": round(waited, 3)})


async def healthz(request: web.Request) -> web.Response:
    health = await request.app[LOCKS].health()
    body = {"ok": health.ok, "latency_s": health.latency, "held": health.held, "error": health.error}
    return web.json_response(body, status=200 if health.ok else 503)


def make_app(locks: asynclock.Locks | None = None) -> web.Application:
    """The app; with ``locks``, it uses that client (a test's, or one the process shares) instead of its own."""
    app = web.Application()
    if locks is None:
        app.cleanup_ctx.append(lock_client)
    else:
        app[LOCKS] = locks
    app.router.add_post("/jobs/{name}", run_job)
    app.router.add_get("/healthz", healthz)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=8080)
