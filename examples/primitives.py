"""The fair lock, the read-write lock and the semaphore, in one small program.

    python examples/primitives.py                         # memory://, no server
    python examples/primitives.py redis://127.0.0.1:6379/0

* ``nightly`` is a fair lock: five workers queue for it and get it in the
  order they asked.
* ``catalog`` is a read-write lock: three readers share it; the writer that
  comes along waits for them, and keeps readers that arrive after it out.
* ``gpu`` is a semaphore with two permits: six jobs, at most two at a time.

It prints what happened, one line per event, and returns the log.
"""

from __future__ import annotations

import asyncio
import sys

import asynclock

PAUSE = 0.05


async def until_waiting(lock: asynclock.Lock, count: int) -> None:
    """Wait (at most 5 s) until the server has ``count`` waiters queued on ``lock``."""
    async with asyncio.timeout(5):
        while (await lock.info()).waiters != count:  # noqa: ASYNC110 - the state is on the server
            await asyncio.sleep(0.005)


async def fair_queue(locks: asynclock.Locks, log: list[str]) -> None:
    lock = locks.lock("nightly", fair=True)

    async def worker(i: int) -> None:
        async with lock as lease:
            log.append(f"nightly: worker {i} runs (token {lease.token})")
            await asyncio.sleep(PAUSE / 5)

    async with lock:  # hold it while the workers queue up, one after another
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(worker(i)))
            await until_waiting(lock, i + 1)
    await asyncio.gather(*tasks)


async def readers_and_a_writer(locks: asynclock.Locks, log: list[str]) -> None:
    rw = locks.rw_lock("catalog")

    readers_in = asyncio.Event()  # set once readers 1, 2 and 3 all hold it
    reading: set[int] = set()

    async def reader(i: int) -> None:
        if i == 4:  # the late reader comes once the writer waits
            await until_waiting(rw.write, 1)
        async with rw.read:
            log.append(f"catalog: reader {i} reads")
            reading.add(i)
            if reading >= {1, 2, 3}:
                readers_in.set()
            await asyncio.sleep(PAUSE)
            log.append(f"catalog: reader {i} done")  # (still inside: the next holder may go first)

    async def writer() -> None:
        await readers_in.wait()
        async with rw.write as lease:
            log.append(f"catalog: writer writes (token {lease.token})")
            async with rw.read:  # the writer may read too: it joins the write hold
                await asyncio.sleep(PAUSE / 5)
            log.append("catalog: writer done")

    await asyncio.gather(reader(1), reader(2), reader(3), writer(), reader(4))


async def two_at_a_time(locks: asynclock.Locks, log: list[str]) -> int:
    sem = locks.semaphore("gpu", permits=2)
    running = 0
    most = 0

    async def job(i: int) -> None:
        nonlocal running, most
        async with sem as lease:
            running += 1
            most = max(most, running)
            log.append(f"gpu: job {i} runs with permit token {lease.token} ({running} running)")
            await asyncio.sleep(PAUSE / 2)
            running -= 1

    await asyncio.gather(*(job(i) for i in range(6)))
    return most


async def main(url: str = "memory://") -> list[str]:
    log: list[str] = []
    async with asynclock.connect(url, ttl=10, prefix="examples") as locks:
        await fair_queue(locks, log)
        await readers_and_a_writer(locks, log)
        most = await two_at_a_time(locks, log)
        log.append(f"gpu: at most {most} jobs ran at once")
    return log


if __name__ == "__main__":
    for line in asyncio.run(main(*sys.argv[1:2])):
        print(line)
