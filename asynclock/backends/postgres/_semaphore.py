"""The semaphore: N slot keys and a gate, on the lease connections of its holds.

A semaphore of N permits is N advisory keys, slot 0 to N-1, plus a gate
key. A hold owns one slot on its own connection, so a holder whose session
ends (crash, ``pg_terminate_backend``, idle timeout) frees its permit at
once. An acquire tries the slots in one statement while nobody waits (it
takes the gate shared for that instant). Waiters queue on the gate
(exclusive, the server's FIFO queue); the head of the queue holds the gate,
LISTENs on the semaphore's channel, and tries the slots again when a
release NOTIFYs it, or after at most a request window when no message came
(a holder that died sends none). Only the head ever retries, so a release
wakes one waiter per semaphore, and every permit has its own token from the
semaphore's counter.

Every client of a semaphore must ask for the same number of permits: the
fence row records the holders' number, each hold takes a key of its number
shared, and a client that asks for another number while that key is taken
gets ValueError from its acquire, before it waits (see ``check_permits``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from ..._timing import request_window
from ...abc import Acquired, Queued
from . import _sql
from ._hold import Hold, ms
from ._keys import PERMITS_MARK, app_name, channel, fence_row, gate_key, permits_key, slot_arrays
from ._requests import Requests

__all__ = ["Permits"]


class Permits:
    """The requests of a semaphore's holds."""

    def __init__(self, requests: Requests) -> None:
        self._requests = requests

    async def try_permit(self, record: Hold) -> Acquired | None:
        """The one try of a new hold: Acquired, or None if no slot is free or somebody waits."""
        requests = self._requests
        prefix, ref = requests.prefix, record.ref
        gate = gate_key(prefix, ref.name)
        highs, lows = slot_arrays(prefix, ref.name, ref.permits)
        mine = permits_key(prefix, ref.name, ref.permits)
        record.args = (
            *gate,
            highs,
            lows,
            fence_row(ref),
            app_name(prefix, ref.name, record.hold),
            requests.idle(record.ttl),
            *mine,
        )
        record.notify = channel(prefix, ref.name)
        sent = asyncio.get_running_loop().time()
        row = await requests.try_statement(record, requests.sql.try_slot, False)
        if row is None:
            return None
        await self.check_permits(record, row)  # before any wait: a client with another number never queues
        if row["slot"] is None:
            return None
        record.before = (row["app0"], row["idle0"])
        return Acquired(int(row["token"]), confirmed_at=sent)

    async def wait(self, record: Hold, until: float | None) -> Acquired | Queued:
        """Queue for the gate; as its holder (the head), try the slots at each release, until ``until``."""
        requests = self._requests
        conn = record.conn
        loop = asyncio.get_running_loop()
        if not record.at_gate:
            await requests.arm_check(record)
            if record.listener is None:
                event = record.notified = asyncio.Event()

                def on_release(*_: Any) -> None:
                    event.set()

                record.dirty = True
                record.listener = on_release
                assert record.notify is not None
                async with requests.errors, asyncio.timeout(record.ttl):
                    await conn.add_listener(record.notify, on_release)
            lock_timeout = "0" if until is None else ms(max(until - loop.time(), 0.001))
            gate = record.args[:2]
            row = await requests.wait_statement(
                record, until, _sql.WAIT_GATE, *gate, lock_timeout, requests.idle(record.ttl)
            )
            if row is None or not row["ok"]:
                return Queued(None)
            record.at_gate = True
        notified = record.notified
        assert notified is not None
        # The head waits idle between tries: well within its idle_session_timeout (ttl).
        recheck = max(0.005, request_window(record.ttl))
        while True:
            notified.clear()
            sent = loop.time()
            # Only a fence row held elsewhere makes it wait: up to ``until``.
            lock_timeout = "0" if until is None else ms(max(until - sent, 0.001))
            async with requests.errors, asyncio.timeout_at(sent + record.ttl):
                try:
                    row = await conn.fetchrow(requests.sql.try_slot, *record.args, lock_timeout, True)
                except asyncpg.LockNotAvailableError:
                    return Queued(None)  # out of time (the release unlocks whatever it got)
            if row["slot"] is not None:
                await self.check_permits(record, row)
                record.before = (row["app0"], row["idle0"])
                return Acquired(int(row["token"]), confirmed_at=sent)
            now = loop.time()
            if until is not None and now >= until:
                return Queued(None)
            pause = recheck if until is None else min(recheck, until - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await notified.wait()

    async def check_permits(self, record: Hold, row: Any) -> None:
        """ValueError if the semaphore is held with another number of permits than this hold's.

        ``row`` is the answer of a slot statement: the permits its fence row
        records. Every hold takes :func:`permits_key` of its number shared,
        so a number is in use while that key cannot be taken exclusively.
        The record changes only when it differs from ours and its number is
        no longer in use (a client of the new number holds a slot by then),
        under the row's lock, so two clients that disagree never both hold.
        Costs nothing while the record matches.
        """
        permits = record.ref.permits
        if row["permits"] == permits and row["mark"] == PERMITS_MARK:
            return
        if row["permits"] is None:
            return  # nothing recorded yet: the first hold records it
        requests = self._requests
        conn, name, fence = record.conn, record.ref.name, fence_row(record.ref)
        granted = row["slot"] is not None
        async with requests.errors, asyncio.timeout(record.ttl), conn.transaction():
            current = await conn.fetchrow(requests.sql.permits_row, fence)
            if current is None or (current["k1"] == permits and current["k2"] == PERMITS_MARK):
                return
            if current["k2"] == PERMITS_MARK:
                theirs = int(current["k1"])
                in_use = await conn.fetchval(_sql.PERMITS_IN_USE, *permits_key(requests.prefix, name, theirs))
                if in_use:
                    raise ValueError(
                        f"semaphore {name!r} is held with permits={theirs} by other clients; this one asks for"
                        f" permits={permits}: every client of a semaphore must use the same number"
                    )
            if granted:
                await conn.execute(requests.sql.record_permits, fence, permits)
