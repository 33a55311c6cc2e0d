"""The plain and the fair lock on one Redis server: one string, and a queue only on contention.

Two keys share the ``{N}`` hash tag of the lock ``N``:

* ``X = <prefix>:{N}:x`` (string): held, ``"<token> <count> <flag> <expiry
  ms> <hold>"`` with the key expiring at that expiry (server time); ``flag``
  is ``q`` while somebody may be queued, else ``-``. Free, ``"<token>"``:
  the last fencing token, kept for a day after the release.
* ``Q = <prefix>:{N}:x:q`` (list): the queued holds, oldest first, each
  ``"<deadline ms> <ttl ms> <channel> <hold>"``: the entry's server-time
  deadline (a waiter keeps it alive by polling), the ttl its hold gets, and
  the channel its client listens to. It exists only while somebody waits.

On Redis Cluster (``sharded``) a script may publish only on a shard channel
of its own slot: the scripts SPUBLISH, and a client's hand-over channel for
the lock ``N`` is ``X:w:<client id>``, in X's slot, which the client
subscribes (SSUBSCRIBE, on the slot's node) while it has a hold in N's queue.

An uncontended acquire is ``GET X``, ``TIME``, ``SET X``; an uncontended
release, ``SET X <token> GET`` (the hold's token is known to this client).
A lock that is free has nobody queued (a release that finds ``q`` hands
over), so a free X is taken at once; an absent X with a queue (the holder
expired) serves the head first: nobody jumps the queue, not even
``timeout=0``, which never queues. A hand-over makes the head the holder
inside the release script and publishes ``"<hold> <token>"`` on its client's
channel (``_queue.py``); a grant whose message reaches nobody is taken back
and the next is served.

Fencing tokens are ``max(last token + 1, server time in µs)``: the stored
token keeps them increasing while Redis keeps its data, and the time floor
after a restart without data, an eviction, or a failover to a replica that
missed the last grants. It assumes the server's clock does not step back by
more than a day. The scripts are ``_scripts/exclusive_*.lua``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._errors import BackendUnavailable, LockError
from ..._values import LockInfo
from ...abc import LockRef, RenewItem
from ._connection import FENCE_LIFETIME_MS, Connection, Script, ms, text
from ._queue import Entered
from ._renew import chunks, renew_failed
from ._wire import bulk

__all__ = ["ExclusiveLock"]

#: How many locks' encoded keys are kept.
KEY_CACHE = 4096

ACQUIRE = Script.load("exclusive_prelude.lua", "exclusive_acquire.lua")
ACQUIRE_ALL = Script.load("exclusive_prelude.lua", "exclusive_acquire_all.lua")
RELEASE = Script.load("exclusive_prelude.lua", "exclusive_release.lua")
SET_COUNT = Script.load("exclusive_prelude.lua", "exclusive_set_count.lua")
INFO = Script.load("exclusive_prelude.lua", "exclusive_info.lua")
RENEW = Script.load("exclusive_renew.lua")
LEADER = Script.load("exclusive_leader.lua")
#: Redis Cluster: hand-overs and an election's announcements on shard channels of the lock's slot.
ACQUIRE_SHARDED = Script.load("exclusive_prelude.lua", "exclusive_acquire.lua", replace=("'PUBLISH'", "'SPUBLISH'"))
RELEASE_SHARDED = Script.load("exclusive_prelude.lua", "exclusive_release.lua", replace=("'PUBLISH'", "'SPUBLISH'"))

_FENCE = bulk(FENCE_LIFETIME_MS)
_ONE, _ZERO, _EMPTY = bulk(1), bulk(0), bulk(b"")


class _Held:
    """What this client knows of a hold it has: its token, and its renewal's encoded key and arguments."""

    __slots__ = ("args", "key", "token")

    def __init__(self, token: bytes, key: bytes, args: tuple[bytes, bytes]) -> None:
        self.token = token
        self.key = key
        self.args = args


class ExclusiveLock:
    """Plain and fair locks of one server; ``channel`` is this client's hand-over channel.

    ``suffix`` names the kind of key (``x`` for the locks); with ``announces``
    (elections) the scripts publish X's value on the channel ``X`` whenever
    who holds X changes. ``sharded`` (Redis Cluster): ``channel`` is this
    client's id, and its hand-over channel of each lock is
    :meth:`handover_channel`; the scripts publish on shard channels.
    """

    def __init__(
        self,
        connection: Connection,
        prefix: str,
        channel: str,
        *,
        suffix: str = "x",
        announces: bool = False,
        sharded: bool = False,
    ) -> None:
        self._connection = connection
        self._prefix = prefix
        self._client = channel
        self._channel = bulk(channel)
        self._suffix = suffix
        self._announces = announces
        self._sharded = sharded
        self._acquire, self._release = (ACQUIRE_SHARDED, RELEASE_SHARDED) if sharded else (ACQUIRE, RELEASE)
        # per name: X, Q, the channel told of changes ('' for a lock) and this
        # client's hand-over channel, RESP-encoded
        self._keys: dict[str, tuple[bytes, bytes, bytes, bytes]] = {}
        self._ttls: dict[float, bytes] = {}
        self._held: dict[str, _Held] = {}

    def key(self, name: str) -> str:
        """The lock's string X, ``<prefix>:{<name>}:<suffix>``."""
        return f"{self._prefix}:{{{name}}}:{self._suffix}"

    def handover_channel(self, name: str) -> str:
        """Where this client hears of a hand-over of ``name`` to one of its holds: ``X:w:<client
        id>`` on a Cluster (a shard channel in X's slot), else the client's one channel."""
        return f"{self.key(name)}:w:{self._client}" if self._sharded else self._client

    def _encoded(self, name: str) -> tuple[bytes, bytes, bytes, bytes]:
        keys = self._keys.get(name)
        if keys is None:
            if len(self._keys) >= KEY_CACHE:
                self._keys.clear()
            x = self.key(name)
            told = bulk(x) if self._announces else _EMPTY
            handover = bulk(self.handover_channel(name)) if self._sharded else self._channel
            keys = self._keys[name] = (bulk(x), bulk(x + ":q"), told, handover)
        return keys

    def _ttl(self, ttl: float) -> bytes:
        encoded = self._ttls.get(ttl)
        if encoded is None:
            if len(self._ttls) >= KEY_CACHE:
                self._ttls.clear()
            encoded = self._ttls[ttl] = bulk(ms(ttl))
        return encoded

    def held(self, ref: LockRef, hold: str, ttl: float, token: int) -> None:
        """``hold`` holds the lock now with ``token`` (its release and renewals rely on it)."""
        self._held[hold] = _Held(b"%d" % token, self._encoded(ref.name)[0], (bulk(hold), self._ttl(ttl)))

    async def enter(
        self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool, fresh: bool, entry: bytes = b""
    ) -> Entered:
        """One acquire request: take it, re-enter it, or (``enqueue``) queue or poll.

        ``fresh``: the first request of ``hold`` (it cannot be queued yet);
        ``entry``: its queue entry as last answered. With the connection's
        ``replicas``, a request that grants is confirmed by them (WAIT), and
        one they do not confirm is given back.
        """
        connection = self._connection
        x, q, told, handover = self._encoded(ref.name)
        args = (
            bulk(hold),
            self._ttl(ttl),
            _ONE if enqueue else _ZERO,
            handover,
            _ONE if fresh else _ZERO,
            bulk(entry) if entry else _EMPTY,
            told,
        )
        keys = (x, q)
        if not connection.replicas:
            answer = await connection.call(self._acquire, keys, args)
        else:
            # On the same connection, WAIT for the replicas: once this write is
            # on them, so is every earlier one, a hand-over to this hold included.
            answer, confirmed = await connection.call_confirmed(self._acquire, keys, args)
            if isinstance(answer, int) and confirmed < connection.replicas:
                # Not on enough replicas: a failover now could lose it. Give it
                # back (to the next in line); the caller retries or fails.
                await self.release(ref, hold)
                raise BackendUnavailable(
                    f"only {confirmed} of {connection.replicas} replicas confirmed the acquire within the"
                    " replica timeout"
                )
        if isinstance(answer, int):
            self.held(ref, hold, ttl, answer)
            return Entered(answer)
        hint, _, queued = (answer.encode() if isinstance(answer, str) else answer).partition(b" ")
        return Entered(None, int(hint) / 1000 if hint != b"-1" else None, queued)

    async def enter_all(self, refs: Sequence[LockRef], holds: Sequence[str], ttl: float) -> list[int] | float | None:
        """One request for every lock of ``refs`` (``holds[i]`` for ``refs[i]``), all or none, never queued.

        Returns their tokens, or the seconds until a holder's lease ends
        (None: unknown) when one is taken and none was. Only where one server
        has every key (not on a Cluster). With ``replicas``, a grant they do
        not confirm is given back.
        """
        connection = self._connection
        keys: list[bytes] = []
        for ref in refs:
            x, q, _, _ = self._encoded(ref.name)
            keys += (x, q)
        args = (self._ttl(ttl), *(bulk(hold) for hold in holds))
        if not connection.replicas:
            answer = await connection.call(ACQUIRE_ALL, keys, args)
        else:
            answer, confirmed = await connection.call_confirmed(ACQUIRE_ALL, keys, args)
            if isinstance(answer, list) and confirmed < connection.replicas:
                for ref, hold in zip(refs, holds, strict=True):
                    await self.release(ref, hold)
                raise BackendUnavailable(
                    f"only {confirmed} of {connection.replicas} replicas confirmed the acquire within the"
                    " replica timeout"
                )
        if not isinstance(answer, list):
            return int(answer) / 1000 if int(answer) >= 0 else None
        tokens = [int(token) for token in answer]
        for ref, hold, token in zip(refs, holds, tokens, strict=True):
            self.held(ref, hold, ttl, token)
        return tokens

    async def release(self, ref: LockRef, hold: str, entry: bytes = b"") -> bool:
        """Give up ``hold`` (to the head of the queue), or take it out of the queue."""
        known = self._held.pop(hold, None)
        x, q, told, _ = self._encoded(ref.name)
        args = (
            bulk(hold),
            _FENCE,
            bulk(known.token) if known is not None else _EMPTY,
            bulk(entry) if entry else _EMPTY,
            told,
        )
        return bool(await self._connection.call(self._release, (x, q), args))

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        x, q, _, _ = self._encoded(ref.name)
        answer = await self._connection.call(SET_COUNT, (x, q), (bulk(hold), bulk(count), bulk(ms(ttl))))
        return bool(int(answer))

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """Renew ``items``: one script call per ``RENEW_CHUNK`` holds (``_renew.py``), every call in one write.

        Each answer is a string of ``1`` (renewed) and ``0`` (not the holder
        any more); with ``replicas``, a renewal they do not confirm is an
        error (retried until the lease's deadline).
        """
        connection = self._connection
        calls: list[tuple[list[bytes], list[bytes]]] = []
        for chunk in chunks(items):
            keys: list[bytes] = []
            args: list[bytes] = []
            for item in chunk:
                held = self._held.get(item.hold)
                if held is None:  # (not granted through this client: encoded now)
                    held = _Held(b"", self._encoded(item.name)[0], (bulk(item.hold), bulk(ms(item.ttl))))
                keys.append(held.key)
                args += held.args
            calls.append((keys, args))
        try:
            answers, confirmed = await connection.call_many(RENEW, calls, wait=bool(connection.replicas))
        except LockError as exc:
            return [renew_failed(exc)] * len(items)
        results: list[bool | BaseException] = []
        for (keys, _), answer in zip(calls, answers, strict=True):
            if isinstance(answer, BaseException):
                results += [renew_failed(answer)] * len(keys)
                continue
            flags = answer if isinstance(answer, bytes) else str(answer).encode()
            if confirmed is not None and confirmed < connection.replicas:
                # Renewed on the primary only: not trusted; retried until the deadline.
                error = BackendUnavailable(f"only {confirmed} of {connection.replicas} replicas confirmed the renewal")
                results += [error if flag == 0x31 else False for flag in flags]
            else:
                results += [flag == 0x31 for flag in flags]
        return results

    async def info(self, ref: LockRef) -> LockInfo:
        x, q, _, _ = self._encoded(ref.name)
        answer = await self._connection.call(INFO, (x, q), ())
        holder, count, token, left, waiting = answer
        key = self.key(ref.name)
        owner = text(holder)
        if owner is None:
            return LockInfo(ref.name, key, None, 0, None, int(waiting), None)
        return LockInfo(ref.name, key, owner, int(count), max(0, int(left)) / 1000, int(waiting), int(token))

    async def leader(self, ref: LockRef) -> tuple[str, int, float | None] | None:
        """Who holds X: the hold, its token and the seconds until its hold expires (None: it
        does not expire, which only a hand-made X does); one read."""
        answer = await self._connection.call(LEADER, self._encoded(ref.name)[:1], ())
        if not answer:
            return None
        holder, token, left = answer
        return text(holder) or "", int(token), None if int(left) < 0 else int(left) / 1000

    async def names(self) -> list[str]:
        """Names of the locks held under the prefix (a free lock's X holds only its last token)."""
        connection = self._connection
        keys = await connection.scan(f"{self._prefix}:{{*}}:{self._suffix}")
        start, end = len(self._prefix) + 2, len("}:") + len(self._suffix)
        found: list[str] = []
        for batch in range(0, len(keys), 1000):
            chunk = keys[batch : batch + 1000]
            with connection.edge:
                values: list[Any] = await connection.client.mget(chunk)
            found += [key[start:-end] for key, value in zip(chunk, values, strict=True) if " " in (text(value) or "")]
        return found
