"""A background worker that must be the only one running, wherever it is started.

Run it (every copy shares the lock server; one consumes, the others wait)::

    ASYNCLOCK_URL=redis://127.0.0.1:6379/0 python examples/worker.py

It consumes work in batches while it holds the lock ``orders-consumer``, and
reacts to what can go wrong:

* The lease is lost (it expired on the server, or renewals could not get
  through in time): the batch under way is cancelled, so it never runs next
  to the next holder's, and the worker queues for the lock again.
* A renewal fails and the lease is *at risk*: before it starts another
  batch, the worker commits what it has processed, so a loss that follows
  costs at most the batch under way.
* The lock service is unavailable: the worker waits ``retry_s`` and tries
  again, consuming nothing meanwhile.

Its tests (tests/test_examples.py) run it on asynclock's testing kit: a
``memory://`` client, the fault controls and the virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import asynclock

log = logging.getLogger("worker")

#: Commit after this many batches (and whenever the lease is at risk).
COMMIT_EVERY = 100


class Worker:
    """Consumes batches while it holds the lock ``name``; ``run()`` until cancelled.

    ``processed`` and ``committed`` count batches; ``terms`` has the fencing
    token of each time it held the lock.
    """

    def __init__(self, locks: asynclock.Locks, *, name: str = "orders-consumer", retry_s: float = 1.0) -> None:
        self.locks = locks
        self.name = name
        self.retry_s = retry_s
        self.processed = 0
        self.committed = 0
        self.terms: list[int | None] = []

    async def process_batch(self, number: int, fencing_token: int | None) -> None:
        """One batch of work (a stand-in: put yours here)."""
        await asyncio.sleep(0.1)

    async def commit(self, upto: int, fencing_token: int | None) -> None:
        """Record that every batch up to ``upto`` is done (a stand-in: put yours here).

        Pass the fencing token to the store, so that it refuses the commit of
        a worker whose lease was lost meanwhile.
        """
        self.committed = upto

    async def lost(self, error: asynclock.LockLost) -> None:
        """The lease was lost and the batch under way cancelled; the worker queues again next."""
        log.warning("lost the lock %r (%s): the batch under way was cancelled", self.name, error.loss)

    async def unavailable(self, error: asynclock.BackendUnavailable) -> None:
        """The lock service could not be reached: wait ``retry_s`` before trying again."""
        log.warning("lock service unavailable (%s); trying again in %s s", error, self.retry_s)
        await asyncio.sleep(self.retry_s)

    async def run(self) -> None:
        """Hold the lock and consume, until cancelled (leaving releases the lock)."""
        while True:
            try:
                async with self.locks.lock(self.name) as lease:
                    self.terms.append(lease.token)
                    log.info("consuming, token %s", lease.token)
                    await self._consume(lease)
            except asynclock.LockLost as error:
                await self.lost(error)
            except asynclock.BackendUnavailable as error:
                await self.unavailable(error)

    async def _consume(self, lease: asynclock.Lease) -> None:
        while True:
            if lease.at_risk and self.committed < self.processed:
                # A renewal failed: the lease may be lost soon. Save the work done so far.
                await self.commit(self.processed, lease.token)
            await self.process_batch(self.processed + 1, lease.token)
            self.processed += 1
            if self.processed % COMMIT_EVERY == 0:
                await self.commit(self.processed, lease.token)


async def main() -> None:
    async with asynclock.connect(os.environ.get("ASYNCLOCK_URL", "memory://")) as locks:
        await Worker(locks).run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
