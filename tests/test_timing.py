"""The shared request bounds (``_timing.Deadlines``): like ``asyncio.timeout_at``
for each block, with one loop timer for all of a client's requests."""

from __future__ import annotations

import asyncio

import pytest

from asynclock._timing import Backoff, Deadlines
from tests.harnesses import insides

pytestmark = pytest.mark.anyio


async def test_a_block_past_its_deadline_raises_timeout_and_one_in_time_does_not() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        with deadlines.bound(loop.time() + 0.05):
            await asyncio.sleep(10)
    with deadlines.bound(loop.time() + 10):
        await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):  # already past: the first await raises, as asyncio.timeout_at does
        with deadlines.bound(loop.time() - 1):
            await asyncio.sleep(0)
    with deadlines.bound(None):
        await asyncio.sleep(0)
    assert not insides.bounds_open(deadlines)


async def test_each_block_keeps_its_own_deadline_among_many() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    ended: dict[str, str] = {}

    async def request(name: str, bound: float, takes: float) -> None:
        try:
            with deadlines.bound(loop.time() + bound):
                await asyncio.sleep(takes)
            ended[name] = "done"
        except TimeoutError:
            ended[name] = "timed out"

    await asyncio.gather(
        request("late", 0.05, 1.0),
        request("quick", 1.0, 0.01),
        request("later", 0.15, 1.0),
        request("slow but in time", 1.0, 0.3),
    )
    assert ended == {"late": "timed out", "quick": "done", "later": "timed out", "slow but in time": "done"}


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    async def request() -> None:
        with deadlines.bound(loop.time() + 10):
            started.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(request())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not insides.bounds_open(deadlines)


async def test_a_stream_of_requests_that_end_in_time_arms_one_timer() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    with deadlines.bound(loop.time() + 5):
        await asyncio.sleep(0)
    timer = insides.armed_timer(deadlines)
    assert timer is not None
    for _ in range(200):
        with deadlines.bound(loop.time() + 5):
            await asyncio.sleep(0)
    assert insides.armed_timer(deadlines) is timer and not timer.cancelled()  # the first one, never armed again


def test_backoff_doubles_up_to_its_cap_and_starts_over() -> None:
    backoff = Backoff(0.02, 0.1)
    assert [backoff.next() for _ in range(5)] == [0.02, 0.04, 0.08, 0.1, 0.1]
    backoff.reset()
    assert backoff.peek() == 0.02
