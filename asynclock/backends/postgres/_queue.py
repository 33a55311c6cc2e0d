"""Waiting without a connection per waiter: a FIFO queue table, woken by NOTIFY.

A waiter that finds its lock taken puts a row in ``<table>_queue`` (through
the client's listening session, which holds the key's marker first and
keeps the row live) and waits for a notification on its client's channel:

* A release that finds the key's marker taken sends WAKE, which NOTIFYs the
  first live row's client (``t``): one waiter per release, no herd.
* That waiter tries again (the primitive's ``head_try``): only the first
  live row may take the lock, and the same statement deletes its row (and
  the dead ones before it) and tells the next live row that it is first now
  (``h``; ``t`` when both are read holds, or for a semaphore: it may get in
  at once too). So hand-overs go in ticket order, each costing the release,
  one wake and one try.
* A newcomer that finds a marker taken does not take the lock (it lets go of
  it again if it had it free, and wakes the first waiter in its place), so
  nobody jumps the queue, not even with ``timeout=0``.
* No message is sent when a holder's session just ends (crash, idle
  timeout) or a waiter's client dies: the first waiter looks again every
  request window, the others every ttl, and a dead row (its listening
  session gone) is passed over and deleted by the next grant.

Right after a row is in, its waiter tries once more: a release whose wake
ran before the row was committed could not see it, but its unlock came
before, so that try finds the lock free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..._timing import request_window
from ...abc import Acquired, Queued
from .._background import Background
from ._hold import Hold
from ._listener import Listener
from ._tokens import Schema

__all__ = ["Queue"]


class Queue:
    """The queue of one backend's waiters."""

    def __init__(self, schema: Schema, listener: Listener, background: Background) -> None:
        self._schema = schema
        self._listener = listener
        self._background = background
        #: local holds queued (or on their way in), for every key
        self.waiting = 0

    def count_in(self, record: Hold) -> None:
        """``record`` is to wait: it counts as a local waiter of its key, and in the key's marker."""
        if not record.marked:
            record.marked = True
            self.waiting += 1
            record.state.waiting += 1
            self._listener.want(record.state.marker)
            if record.woken is None:
                record.woken = asyncio.Event()

    def count_out(self, record: Hold) -> None:
        """``record`` waits no more (granted, or gone)."""
        if record.marked:
            record.marked = False
            self.waiting -= 1
            record.state.waiting -= 1
            self._listener.drop(record.state.marker)

    async def enqueue(self, record: Hold) -> None:
        """Put ``record``'s row in the queue (again, if its listening session ended), in a task of its own."""
        self.count_in(record)
        task = record.queuing
        if task is None or task.done():
            task = record.queuing = self._background.spawn(
                self._listener.statement(lambda conn: self._put(conn, record), changes=True)
            )
        await asyncio.shield(task)

    async def _put(self, conn: Any, record: Hold) -> None:
        listener, schema = self._listener, self._schema
        sql = schema.sql
        marker = record.state.marker
        if not listener.held(marker):  # (wanted since count_in: the marker goes before the row)
            await listener.mark_on(conn)
        if record.ticket is not None:  # a row of an ended listening session: dead already
            await conn.execute(sql.delete_row, record.ticket)
            record.ticket = None
        await listener.keep_alive_for(record.ttl, conn, schema.pg14)
        k1, k2 = record.state.key
        record.ticket = await conn.fetchval(
            sql.enqueue, k1, k2, record.shared, record.hold, listener.backend, *listener.key
        )
        record.incarnation = listener.incarnation

    def stale(self, record: Hold) -> bool:
        """Whether ``record`` has no live row: never queued, or its listening session ended."""
        listener = self._listener
        return record.ticket is None or record.incarnation != listener.incarnation or not listener.alive

    async def leave(self, record: Hold) -> None:
        """Take ``record``'s row out of the queue and tell the next waiter to try in its place."""
        task = record.queuing
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait({task}, timeout=request_window(record.ttl) * 3)
        ticket = record.ticket
        record.ticket = None
        listener = self._listener
        try:
            if ticket is not None and record.incarnation == listener.incarnation and listener.alive:
                k1, k2 = record.state.key
                sql = self._schema.sql
                await listener.job(lambda conn: conn.fetchval(sql.leave, ticket, k1, k2, *listener.key))
        finally:
            self.count_out(record)

    async def wait(
        self, record: Hold, until: float | None, head_try: Callable[[Hold], Awaitable[Acquired | None]]
    ) -> Acquired | Queued:
        """Wait for ``record``'s turn until the loop time ``until``: Acquired, or Queued at ``until``."""
        loop = asyncio.get_running_loop()
        woken = record.woken
        assert woken is not None
        while True:
            if self.stale(record):
                await self.enqueue(record)
                woken.clear()
                record.try_now = False
                got = await head_try(record)
                if got is not None:
                    return got
                if record.ticket is None:
                    continue  # the row went meanwhile (its listening session ended): queue again
            now = loop.time()
            if until is not None and now >= until:
                return Queued(None)
            # The first in line looks again every request window (a holder that died sends
            # nothing); the others every ttl (in case the ones before them died too).
            period = request_window(record.ttl) if record.head else record.ttl
            timeout = period if until is None else min(period, until - now)
            timed_out = False
            if not woken.is_set():
                try:
                    async with asyncio.timeout(timeout):
                        await woken.wait()
                except TimeoutError:
                    timed_out = True
            if not (timed_out or record.try_now or self.stale(record)):
                woken.clear()  # only told it is first in line now: wait at the first's pace
                continue
            woken.clear()
            record.try_now = False
            if self.stale(record):
                continue
            got = await head_try(record)
            if got is not None:
                return got
