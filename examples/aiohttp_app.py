"""An aiohttp app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py

``POST /jobs/{name}`` runs the job ``name`` while holding the lock
``job:{name}``: two requests for the same job, on any of the app's processes,
run one after the other; the second one waits for the first, for at most
``wait`` seconds (default 10): then it gets a 503 with ``Retry-After``, as it
does when the lock service stays unavailable for the wait. A job whose lease
is lost while it runs is cancelled and answered with a 503 that says so.
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
    async with asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://")) as locks:
        app[LOCKS] = locks
        yield


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
        lease = await lock.acquire(timeout=wait)
    except asynclock.LockTimeout:
        # Another process has run this job for the whole wait: tell the client when to come back.
        raise web.HTTPServiceUnavailable(text=f"job {name!r} is running elsewhere", headers=come_back) from None
    except asynclock.BackendUnavailable as exc:
        # The lock service did not answer for the whole wait: nobody can tell who runs the job.
        raise web.HTTPServiceUnavailable(
            text=f"job {name!r} cannot run now: the lock service is unavailable", headers=come_back
        ) from exc
    waited = time.monotonic() - asked
    try:
        async with lock:  # re-enters the hold: the job runs in the lease's cancel scope
            await build_report(name, lease.token, seconds)
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now.
        raise web.HTTPServiceUnavailable(text=f"job {name!r} stopped: {exc}") from exc
    finally:
        if lock.held:  # (not held any more if the lease was lost)
            await lock.release()  # undoes the acquire
    return web.json_response({"job": name, "token": lease.token, "waited_s": round(waited, 3)})


def make_app(locks: asynclock.Locks | None = None) -> web.Application:
    """The app; with ``locks``, it uses that client (a test's, or one the process shares) instead of its own."""
    app = web.Application()
    if locks is None:
        app.cleanup_ctx.append(lock_client)
    else:
        app[LOCKS] = locks
    app.router.add_post("/jobs/{name}", run_job)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=8080)
