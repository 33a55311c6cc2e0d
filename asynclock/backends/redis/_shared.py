"""The read-write lock and the semaphore on one Redis server: a queued resource.

Requests are told apart by their mode: ``x`` (exclusive: the write side),
``r`` (shared: the read side) and ``s`` (one of ``permits``: the
semaphore). A resource of the family ``rw`` or ``sem`` and the name ``N`` is
five keys sharing the ``{N}`` hash tag (``<base>`` is ``<prefix>:{N}:<family>``):

* ``<base>``: ZSET of the holds, scored by the server-time (ms) at which each
  expires. Every hold has its own expiry, so a dead reader or semaphore holder
  lets go after its own ttl while the others keep theirs.
* ``<base>:data``: HASH hold id -> ``"<mode> <token> <count>"``; for a
  semaphore also ``#permits`` -> the number of permits its holders and
  waiters use (a client that asks with another number is refused while any
  of them is there: two numbers for one semaphore would let too many in).
* ``<base>:queue``: LIST of the queued hold ids, oldest first.
* ``<base>:waiting``: HASH queued hold id -> ``"<deadline ms> <ttl ms> <mode>
  <channel>"``: the entry's server-time deadline (a waiter keeps it alive by
  polling), the ttl its hold gets, and the pub/sub channel its client listens to.
* ``<base>:fence``: the last fencing token, ``max(last + 1, server time in
  µs)`` (see ``_hash.py``), shared by both sides of a rw lock.

Every script first drops expired holds and then *serves* the queue: from the
head, dead entries (deadline passed) are dropped and live ones are granted as
long as they fit (one ``x`` on an empty resource; ``r`` while only readers
hold it; ``s`` while fewer than ``permits`` hold it). A granted waiter becomes
a holder inside the script (token, expiry from its own ttl) and one message,
``"<hold> <token>"``, is published on its client's channel (``_queue.py``).
A grant whose message reaches nobody (the client is gone, or its pub/sub
connection is reconnecting, after which its waiters poll and queue again) is
taken back at once and the next in line is served. An acquire takes the
resource directly only when nobody is queued and it fits, so nobody jumps
the queue, not even ``timeout=0`` (which never queues).

Read-write policy: FIFO phases. A writer in the queue keeps every later
reader behind it; the readers queued behind it get in together once it is
done, up to the next queued writer.

All times are the server's (``TIME``), never the clients'. The scripts are
``_scripts/queue_*.lua``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._values import LockInfo
from ...abc import LockRef, RenewItem
from ._connection import FENCE_LIFETIME_MS, Connection, Script, ms, text
from ._queue import Entered
from ._renew import renew_in_chunks

__all__ = ["QueuedResource"]

#: Request mode and key family of each kind (both sides of a read-write lock are one resource).
MODES = {"write": "x", "read": "r", "semaphore": "s"}
FAMILIES = {"write": "rw", "read": "rw", "semaphore": "sem"}

ACQUIRE = Script.load("queue_prelude.lua", "queue_acquire.lua")
RELEASE = Script.load("queue_prelude.lua", "queue_release.lua")
SET_COUNT = Script.load("queue_prelude.lua", "queue_set_count.lua")
RENEW = Script.load("queue_renew.lua")
INFO = Script.load("queue_prelude.lua", "queue_info.lua")


class QueuedResource:
    """Queued resources of one server: requests by hold id, hand-overs on ``channel``.

    ``channel`` is this client's hand-over channel. (Not with ``replicas``:
    a hand-over to another client's waiter is not confirmed by them.)
    """

    def __init__(self, connection: Connection, prefix: str, channel: str) -> None:
        self._connection = connection
        self._prefix = prefix
        self._channel = channel

    def key(self, ref: LockRef) -> str:
        """The resource's holds ZSET, ``<prefix>:{<name>}:<family>``."""
        return f"{self._prefix}:{{{ref.name}}}:{FAMILIES[ref.kind]}"

    def _keys(self, ref: LockRef) -> list[str]:
        base = self.key(ref)
        return [base, f"{base}:data", f"{base}:queue", f"{base}:waiting", f"{base}:fence"]

    async def enter(
        self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool, fresh: bool, entry: bytes = b""
    ) -> Entered:
        """One acquire request: take it, re-enter it, or (``enqueue``) queue or poll.

        ``fresh``: the first request of ``hold`` (it cannot hold or be queued
        yet), which skips the look-ups that make retries idempotent. (The
        queue finds a hold's entry by its id: ``entry`` is not needed.) Raises
        ValueError (nothing changed) for a semaphore whose users ask for
        another number of permits.
        """
        keys = self._keys(ref)
        args = (hold, MODES[ref.kind], ref.permits, ms(ttl), int(enqueue), self._channel, FENCE_LIFETIME_MS, int(fresh))
        answer = await self._connection.run(ACQUIRE, keys, args)
        if int(answer[0]) == 1:
            return Entered(int(answer[1]))
        if int(answer[0]) == -1:
            raise ValueError(
                f"semaphore {ref.name!r} is used with permits={int(answer[1])} by its holders and waiters;"
                f" this handle asks for permits={ref.permits} (every client must use the same number)"
            )
        return Entered(None, int(answer[1]) / 1000 if int(answer[1]) >= 0 else None)

    def held(self, ref: LockRef, hold: str, ttl: float, token: int) -> None:
        """``hold`` was handed the resource (nothing to keep: its requests name it by its id)."""

    async def release(self, ref: LockRef, hold: str, entry: bytes = b"") -> bool:
        """Give up ``hold`` or take it out of the queue; what it frees goes to the head of the queue."""
        answer = await self._connection.run(RELEASE, self._keys(ref), (hold, ref.permits, FENCE_LIFETIME_MS))
        return int(answer[0]) == 1

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        return bool(await self._connection.run(SET_COUNT, self._keys(ref), (hold, count, ms(ttl))))

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """Renew ``items`` in script calls of ``RENEW_CHUNK`` holds (``_renew.py``)."""
        return await renew_in_chunks(self._connection, RENEW, items, self._renewal)

    def _renewal(self, chunk: Sequence[RenewItem]) -> tuple[list[str], list[str | int]]:
        keys: list[str] = []
        args: list[str | int] = []
        for item in chunk:
            base = self.key(item.ref)
            keys += [base, f"{base}:data"]
            args += [item.hold, ms(item.ttl)]
        return keys, args

    async def info(self, ref: LockRef) -> LockInfo:
        found, waiting = await self._connection.run(INFO, self._keys(ref), ())
        key = self.key(ref)
        holders: list[tuple[str, int, int, float]] = []
        for i in range(0, len(found), 3):
            hold = text(found[i]) or ""
            parts = (text(found[i + 1]) or "").split(" ")
            token = int(parts[1]) if len(parts) == 3 else 0
            count = int(parts[2]) if len(parts) == 3 else 1
            holders.append((hold, token, count, max(0, int(found[i + 2])) / 1000))
        if not holders:
            return LockInfo(ref.name, key, None, 0, None, int(waiting), None)
        hold, token, count, left = holders[0]
        return LockInfo(ref.name, key, hold, count, left, int(waiting), token, tuple(h[0] for h in holders))
