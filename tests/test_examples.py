"""The example apps in examples/, served in-process against a real redis-server, and
under asynclock's testing kit: the ``locks`` fixture (the project turns the pytest plugin
on in pyproject.toml), the fault controls and the virtual clock.

Each app runs its job under ``async with locks.lock(...)``; two concurrent
requests for the same job must run one after the other with increasing
fencing tokens, while requests for different jobs run side by side. The
scheduled app runs as several uvicorn processes against ZooKeeper: each
period's job runs on exactly one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

import asynclock
from asynclock.testing import faults, virtual_clock
from tests.servers import RedisServer, scaled
from tests.servers.base import free_port
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
JOB_S = scaled(0.3)

Post = Callable[[str], Awaitable[dict[str, Any]]]


def load_example(name: str) -> ModuleType:
    """A fresh copy of examples/<name>.py (each test patches its own)."""
    module_name = f"example_{name}_{secrets.token_hex(4)}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclass-like introspection (pydantic) looks modules up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


class JobRecorder:
    """Stands in for the example's ``build_report``: records when each job runs."""

    def __init__(self, gate: int = 1) -> None:
        self.log: list[tuple[str, str, int | None]] = []  # (start|end, job name, token)
        self.active = 0
        self.most_active = 0
        self._gate = gate  # this many jobs must be running at once before any finishes
        self._all_in = asyncio.Event()

    async def __call__(self, name: str, fencing_token: int | None, seconds: float) -> None:
        self.log.append(("start", name, fencing_token))
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        if self.active >= self._gate:
            self._all_in.set()
        try:
            if self._gate > 1:
                async with asyncio.timeout(scaled(5)):
                    await self._all_in.wait()
            await asyncio.sleep(seconds)
        finally:
            self.active -= 1
            self.log.append(("end", name, fencing_token))


@pytest.fixture
def lock_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"{redis_server.url}?prefix=t{secrets.token_hex(4)}"
    monkeypatch.setenv("ASYNCLOCK_URL", url)
    return url


@asynccontextmanager
async def fastapi_client(module: ModuleType) -> AsyncIterator[Post]:
    app = module.app
    transport = httpx.ASGITransport(app=app)
    # ASGITransport sends no lifespan events: enter the app's lifespan ourselves.
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://app") as http:

        async def post(job: str) -> dict[str, Any]:
            response = await http.post(f"/jobs/{job}", params={"seconds": JOB_S})
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        yield post


@asynccontextmanager
async def aiohttp_client(module: ModuleType) -> AsyncIterator[Post]:
    async with TestClient(TestServer(module.make_app(), host="127.0.0.1")) as http:

        async def post(job: str) -> dict[str, Any]:
            response = await http.post(f"/jobs/{job}", params={"seconds": str(JOB_S)})
            assert response.status == 200, await response.text()
            body: dict[str, Any] = await response.json()
            return body

        yield post


CLIENTS: dict[str, Callable[[ModuleType], AbstractAsyncContextManager[Post]]] = {
    "fastapi_app": fastapi_client,
    "aiohttp_app": aiohttp_client,
}


@pytest.mark.parametrize("example", sorted(CLIENTS))
async def test_same_job_requests_are_serialized(example: str, lock_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_example(example)
    recorder = JobRecorder()
    monkeypatch.setattr(module, "build_report", recorder)
    async with CLIENTS[example](module) as post:
        first, second = await asyncio.gather(post("nightly"), post("nightly"))

    assert recorder.most_active == 1, recorder.log
    (s1, _, t1), (e1, _, u1), (s2, _, t2), (e2, _, u2) = recorder.log
    assert (s1, e1, s2, e2) == ("start", "end", "start", "end"), recorder.log
    assert t1 == u1 and t2 == u2
    assert isinstance(t1, int) and isinstance(t2, int) and t2 > t1, "each new holder gets a higher token"
    assert sorted([first["token"], second["token"]]) == [t1, t2]
    assert {first["job"], second["job"]} == {"nightly"}


@pytest.mark.parametrize("example", sorted(CLIENTS))
async def test_different_jobs_run_side_by_side(example: str, lock_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_example(example)
    recorder = JobRecorder(gate=2)  # each job waits until the other one runs too
    monkeypatch.setattr(module, "build_report", recorder)
    async with CLIENTS[example](module) as post:
        a, b = await asyncio.gather(post("invoices"), post("payroll"))

    assert recorder.most_active == 2, recorder.log
    assert {a["job"], b["job"]} == {"invoices", "payroll"}


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_primitives_example_keeps_its_promises(backend: str, request: pytest.FixtureRequest) -> None:
    url = "memory://" if backend == "memory" else request.getfixturevalue("redis_server").url
    module = load_example("primitives")
    log: list[str] = await asyncio.wait_for(module.main(url), scaled(30))
    runs = [line for line in log if line.startswith("nightly: worker")]
    assert [line.split()[2] for line in runs] == ["0", "1", "2", "3", "4"], "the fair lock goes in queue order"
    at = {line: i for i, line in enumerate(log)}
    writes = next(i for i, line in enumerate(log) if line.startswith("catalog: writer writes"))
    for i in (1, 2, 3):
        assert at[f"catalog: reader {i} reads"] < writes and at[f"catalog: reader {i} done"] < writes
    assert at["catalog: writer done"] < at["catalog: reader 4 reads"], "a reader after the writer waits for it"
    assert log[-1] in ("gpu: at most 2 jobs ran at once", "gpu: at most 1 jobs ran at once")
    assert sum(line.startswith("gpu: job") for line in log) == 6


@pytest.mark.parametrize("example", sorted(CLIENTS))
async def test_a_job_busy_for_the_whole_wait_is_a_503_with_retry_after(
    example: str, lock_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process runs the job: the request waits ``wait`` seconds, then
    tells the client to come back instead of hanging on."""
    module = load_example(example)
    recorder = JobRecorder()
    monkeypatch.setattr(module, "build_report", recorder)
    async with asynclock.connect(lock_url) as other:
        async with other.lock("job:nightly"):
            if example == "fastapi_app":
                app = module.app
                transport = httpx.ASGITransport(app=app)
                async with (
                    app.router.lifespan_context(app),
                    httpx.AsyncClient(transport=transport, base_url="http://app") as http,
                ):
                    async with asyncio.timeout(scaled(10)):
                        response = await http.post("/jobs/nightly", params={"seconds": JOB_S, "wait": JOB_S})
                status, headers, text = response.status_code, response.headers, response.text
            else:
                async with TestClient(TestServer(module.make_app(), host="127.0.0.1")) as client:
                    async with asyncio.timeout(scaled(10)):
                        reply = await client.post("/jobs/nightly", params={"seconds": str(JOB_S), "wait": str(JOB_S)})
                        status, headers, text = reply.status, reply.headers, await reply.text()
    assert status == 503, text
    assert int(headers["Retry-After"]) >= 1
    assert "nightly" in text
    assert recorder.log == [], "the job did not run"


# -- the examples under asynclock's testing kit: lock loss and an unavailable lock service ---------


async def post_job(http: httpx.AsyncClient, job: str, **params: float) -> httpx.Response:
    return await http.post(f"/jobs/{job}", params=params)


@asynccontextmanager
async def fastapi_on(locks: asynclock.Locks, module: ModuleType) -> AsyncIterator[httpx.AsyncClient]:
    """The FastAPI example on the test's ``locks`` (ASGITransport runs no lifespan: the app makes no client)."""
    module.app.state.locks = locks
    transport = httpx.ASGITransport(app=module.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        yield http


class Job:
    """Stands in for the examples' ``build_report``: runs until told to finish, says how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.ended: list[str] = []

    async def __call__(self, name: str, fencing_token: int | None, seconds: float) -> None:
        self.started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        self.ended.append("finished")


async def test_fastapi_a_job_whose_lock_is_lost_is_cancelled_and_answered_503(
    locks: asynclock.Locks, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_example("fastapi_app")
    job = Job()
    monkeypatch.setattr(module, "build_report", job)
    async with fastapi_on(locks, module) as http:
        answer = asyncio.create_task(post_job(http, "nightly", seconds=3600))
        async with asyncio.timeout(scaled(5)):
            await job.started.wait()
        assert faults(locks).lose("job:nightly")
        response = await asyncio.wait_for(answer, scaled(5))
        assert response.status_code == 503
        assert "job 'nightly' stopped, outcome unknown" in response.json()["detail"]
        assert job.ended == ["cancelled"]
        # nothing is left held: the next request for the job runs
        response = await asyncio.wait_for(post_job(http, "nightly", seconds=0), scaled(5))
        assert response.status_code == 200 and job.ended == ["cancelled", "finished"]


async def test_fastapi_an_unavailable_lock_service_is_a_503_with_retry_after(
    locks: asynclock.Locks, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_example("fastapi_app")
    job = Job()
    monkeypatch.setattr(module, "build_report", job)
    async with virtual_clock(), fastapi_on(locks, module) as http:
        with faults(locks).unavailable():
            # The request waits its 10 s for the lock service (virtual seconds), then gives up.
            response = await asyncio.wait_for(post_job(http, "nightly", wait=10), 60)
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "10"
        assert "the lock service is unavailable" in response.json()["detail"]
        assert not job.started.is_set(), "the job did not run without its lock"

        # The service goes away while a job runs: its lease is at risk, then lost, and the job stopped.
        answer = asyncio.create_task(post_job(http, "nightly", seconds=3600))
        await asyncio.wait_for(job.started.wait(), 60)
        with faults(locks).unavailable():
            response = await asyncio.wait_for(answer, 60)
        assert response.status_code == 503 and "stopped" in response.json()["detail"]
        assert job.ended == ["cancelled"]


async def test_healthz_is_200_while_the_lock_service_answers_and_503_when_it_does_not(
    locks: asynclock.Locks,
) -> None:
    fastapi_module = load_example("fastapi_app")
    async with fastapi_on(locks, fastapi_module) as http:
        response = await http.get("/healthz")
        assert response.status_code == 200 and response.json()["ok"] is True, response.text
        with faults(locks).unavailable():
            response = await http.get("/healthz")
        assert response.status_code == 503 and response.json()["error"], response.text
    aiohttp_module = load_example("aiohttp_app")
    async with TestClient(TestServer(aiohttp_module.make_app(locks), host="127.0.0.1")) as client:
        reply = await client.get("/healthz")
        assert reply.status == 200 and (await reply.json())["ok"] is True
        with faults(locks).unavailable():
            reply = await client.get("/healthz")
        assert reply.status == 503 and (await reply.json())["error"]


async def test_aiohttp_lock_loss_and_an_unavailable_lock_service_are_503s(
    locks: asynclock.Locks, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_example("aiohttp_app")
    job = Job()
    monkeypatch.setattr(module, "build_report", job)
    async with TestClient(TestServer(module.make_app(locks), host="127.0.0.1")) as http:
        answer = asyncio.create_task(http.post("/jobs/nightly", params={"seconds": "3600"}))
        await asyncio.wait_for(job.started.wait(), scaled(5))
        assert faults(locks).lose("job:nightly")
        reply = await asyncio.wait_for(answer, scaled(5))
        assert reply.status == 503 and "job 'nightly' stopped, outcome unknown" in await reply.text()
        assert job.ended == ["cancelled"]
        with faults(locks).unavailable():
            reply = await asyncio.wait_for(http.post("/jobs/nightly", params={"wait": str(JOB_S)}), scaled(10))
        assert reply.status == 503 and "lock service is unavailable" in await reply.text()
        assert int(reply.headers["Retry-After"]) >= 1
        assert job.ended == ["cancelled"], "the job did not run again"


class ObservedWorker:
    """What the tests watch of examples/worker.py's Worker (made by ``observed``)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int | None, str]] = []  # (number, token, finished | cancelled)
        self.losses: list[tuple[asynclock.LossReason | None, int, int]] = []  # (loss, processed, committed)
        self.outages = 0
        self.changed = asyncio.Event()

    def note(self) -> None:
        self.changed.set()

    async def until(self, condition: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def observed(module: ModuleType, locks: asynclock.Locks, *, batch_s: float) -> tuple[Any, ObservedWorker]:
    """The example's Worker with its stand-ins recorded: each batch takes ``batch_s``."""
    seen = ObservedWorker()

    class Worker(module.Worker):  # type: ignore[name-defined,misc]
        async def process_batch(self, number: int, fencing_token: int | None) -> None:
            try:
                await asyncio.sleep(batch_s)
            except asyncio.CancelledError:
                seen.batches.append((number, fencing_token, "cancelled"))
                raise
            finally:
                seen.note()
            seen.batches.append((number, fencing_token, "finished"))

        async def lost(self, error: asynclock.LockLost) -> None:
            seen.losses.append((error.loss, self.processed, self.committed))
            seen.note()
            await super().lost(error)

        async def unavailable(self, error: asynclock.BackendUnavailable) -> None:
            seen.outages += 1
            seen.note()
            await super().unavailable(error)

    return Worker(locks), seen


async def test_worker_stops_its_batch_when_the_lock_is_lost_and_takes_the_lock_again(locks: asynclock.Locks) -> None:
    worker, seen = observed(load_example("worker"), locks, batch_s=scaled(0.05))
    running = asyncio.create_task(worker.run())
    try:
        await seen.until(lambda: len(seen.batches) >= 2, scaled(5))
        assert faults(locks).lose("orders-consumer")  # in the middle of the third batch
        await seen.until(lambda: len(worker.terms) == 2 and seen.batches[-1][1] == worker.terms[1], scaled(5))
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    first, second = worker.terms
    assert first is not None and second is not None and second > first, "a new term, with a higher token"
    assert [loss for loss, _, _ in seen.losses] == [asynclock.LossReason.TAKEN_OR_EXPIRED]
    cut = next(batch for batch in seen.batches if batch[2] == "cancelled")
    assert cut[1] == first, "the batch under way when the lock was lost was cancelled"
    assert all(token == first for _, token, how in seen.batches[: seen.batches.index(cut)])
    assert not locks.lock("orders-consumer").held  # cancelling the worker released it


async def test_worker_commits_when_at_risk_and_waits_out_an_unavailable_lock_service(locks: asynclock.Locks) -> None:
    module = load_example("worker")
    worker, seen = observed(module, locks, batch_s=1.0)  # virtual seconds: a 30 s lease is ~30 batches
    async with virtual_clock():
        running = asyncio.create_task(worker.run())
        try:
            await seen.until(lambda: worker.processed >= 5, 60)
            with faults(locks).unavailable():
                # renewals fail: at risk, then lost at the deadline; acquiring again fails for a while
                await seen.until(lambda: seen.outages >= 2, 600)
            await seen.until(lambda: len(worker.terms) == 2 and worker.processed > seen.losses[0][1], 600)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    [(loss, processed, committed)] = seen.losses
    assert loss is asynclock.LossReason.RENEWAL_FAILED
    assert processed < module.COMMIT_EVERY, "no regular commit came before the loss"
    assert committed == processed, "everything processed was committed when the lease went at risk"
    assert worker.terms[1] > worker.terms[0]


async def test_replicas_of_the_scheduled_app_run_each_period_once(zookeeper_server: ZooKeeperServer) -> None:
    """Three replicas (uvicorn processes) of examples/scheduled_app.py schedule the job every
    period: for every period they all saw, exactly one of them ran it and the others skipped it."""
    period = scaled(1.0)
    url = f"{zookeeper_server.url}?prefix=t{secrets.token_hex(4)}"
    env = {**os.environ, "ASYNCLOCK_URL": url, "JOB_PERIOD": str(period), "PYTHONPATH": str(EXAMPLES.parent)}
    ports = [free_port() for _ in range(3)]
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "uvicorn", "examples.scheduled_app:app", "--port", str(port)),
            *("--host", "127.0.0.1", "--log-level", "warning"),
            cwd=EXAMPLES.parent,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        async with httpx.AsyncClient() as http:

            async def runs(port: int) -> dict[str, Any]:
                response = await http.get(f"http://127.0.0.1:{port}/runs")
                assert response.status_code == 200, response.text
                body: dict[str, Any] = response.json()
                return body

            async with asyncio.timeout(scaled(60)):
                for port in ports:  # every replica up (its scheduler running)
                    while True:
                        with contextlib.suppress(httpx.TransportError):
                            await runs(port)
                            break
                        await asyncio.sleep(0.1)
                up = time.time()
                await asyncio.sleep(5 * period)
            seen = [await runs(port) for port in ports]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), scaled(10))
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    # the periods every replica was scheduling for
    periods = sorted(due for due in {*seen[0]["ran"], *seen[0]["skipped"]} if due > up)
    assert len(periods) >= 3, seen
    for due in periods:
        ran = [replica["pid"] for replica in seen if due in replica["ran"]]
        skipped = [replica["pid"] for replica in seen if due in replica["skipped"]]
        assert len(ran) == 1, f"period {due}: ran on {ran}, skipped on {skipped}"
        assert len(ran) + len(skipped) == len(seen), f"period {due}: a replica did not call the job"
