"""An aiohttp app that runs jobs under a distributed lock.

Run it (the lock server is shared by every process that runs the app)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py

``POST /jobs/{name}`` runs the job ``name`` while holding the lock
``job:{name}``: two requests for the same job, on any of the app's processes,
run one after the other; the second one waits for the first, for at most
``wait`` seconds (default 10): then it gets a 503 with ``Retry-After``. A job
whose lease is lost while it runs is cancelled and answered with a 503 that
says so.
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
    asked = time.monotonic()
    waiting = asyncio.timeout(wait)
    try:
        async with waiting, request.app[LOCKS].lock(f"job:{name}") as lease:
            waiting.reschedule(None)  # held: the job may take as long as it needs
            waited = time.monotonic() - asked
            await build_report(name, lease.token, seconds)
    except TimeoutError:
        if not waiting.expired():
            raise  # the job's own timeout, not the wait for the lock
        # Another process has run this job for the whole wait: tell the client when to come back.
        raise web.HTTPServiceUnavailable(
            text=f"job {name!r} is running elsewhere", headers={"Retry-After": str(max(1, math.ceil(wait)))}
        ) from None
    except asynclock.LockLost as exc:
        # The lease ran out under us: the job was cancelled, another worker may have it now.
        raise web.HTTPServiceUnavailable(text=f"job {name!r} stopped: {exc}") from exc
    return web.json_response({"job": name, "token": lease.token, "waited_s": round(waited, 3)})


def make_app() -> web.Application:
    app = web.Application()
    app.cleanup_ctx.append(lock_client)
    app.router.add_post("/jobs/{name}", run_job)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=8080)
