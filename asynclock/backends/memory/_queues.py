"""The queued primitives' table: fair lock, read-write lock, semaphore and election, granted in FIFO order."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

from ..._values import Leader
from ._table import _clock


class LeaderListener(Protocol):
    """What the table tells of each change of an election's leader (a watch)."""

    def push(self, leader: Leader | None, expires_at: float | None) -> None:
        """Called under the table's mutex, from any thread."""


#: A leader no watch was told of yet.
_UNSEEN = object()

__all__ = ["_ALL_FAMILIES", "_FAMILIES", "_QUEUES", "_PermitsDiffer", "_QueueTable", "_Request", "_queue_key"]


#: The table family of each queued kind: the two sides of a read-write lock share one resource.
_FAMILIES = {"fair": "fair", "read": "rw", "write": "rw", "semaphore": "semaphore", "election": "election"}
#: Every family, for what acts on every primitive of a name.
_ALL_FAMILIES = ("fair", "rw", "semaphore", "election")


@dataclass(slots=True)
class _Holder:
    mode: str
    count: int
    token: int
    expires_at: float  # the loop's clock
    identity: str | None = None  # a candidate's (election)
    since: float = 0.0  # wall-clock time of the grant


@dataclass(slots=True, eq=False)
class _Request:
    hold: str
    mode: str
    ttl: float
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event
    token: int | None = None
    granted_at: float = 0.0  # the loop's clock
    identity: str | None = None


@dataclass(slots=True)
class _Resource:
    holders: dict[str, _Holder]
    queue: list[_Request]
    permits: int  # what the semaphore's first user asked for (1 for the other shapes)


class _PermitsDiffer(Exception):
    """A semaphore asked for with another ``permits`` than its current users'."""

    def __init__(self, permits: int) -> None:
        super().__init__(permits)
        self.permits = permits


class _QueueTable:
    """Resources whose waiters queue in FIFO order, granted here, under one mutex.

    The head of the queue is granted as soon as it is compatible with the
    holders; nobody behind it is granted before it (so a waiting writer keeps
    later readers out, and a fair lock is handed over in order). Expired
    holders are dropped whenever the resource is looked at; waiters look
    again when the earliest holder expires.

    An election's watches are told every change of its leader: each call
    that changes the holder publishes the new one, under the mutex, to every
    watch of that key, in order.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._resources: dict[str, _Resource] = {}
        self._tokens = itertools.count(1)
        self._watches: dict[str, weakref.WeakSet[LeaderListener]] = {}
        self._published: dict[str, Leader | None] = {}

    def _resource(self, key: str, permits: int) -> _Resource:
        res = self._resources.get(key)
        if res is None:
            res = self._resources[key] = _Resource({}, [], permits)
        return res

    @staticmethod
    def _fits(res: _Resource, mode: str, permits: int) -> bool:
        if mode == "x":
            return not res.holders
        if mode == "r":
            return all(holder.mode == "r" for holder in res.holders.values())
        return len(res.holders) < permits

    def _grant(self, key: str, res: _Resource, now: float, permits: int) -> None:
        """Drop expired holders and grant queued requests from the head, in order."""
        for hold in [hold for hold, holder in res.holders.items() if holder.expires_at <= now]:
            del res.holders[hold]
        while res.queue and self._fits(res, res.queue[0].mode, permits):
            req = res.queue.pop(0)
            req.token = next(self._tokens)
            req.granted_at = now
            res.holders[req.hold] = _Holder(req.mode, 1, req.token, now + req.ttl, req.identity, time.time())
            _wake(req)
        if not res.holders and not res.queue:
            del self._resources[key]
        if key in self._watches:
            self._publish(key)

    # -- an election's leader ------------------------------------------------------

    def _leader(self, key: str) -> tuple[Leader | None, float | None]:
        """The holder of ``key`` as a Leader, and when its hold expires (the loop's clock)."""
        res = self._resources.get(key)
        if res is None or not res.holders:
            return None, None
        holder = min(res.holders.values(), key=lambda h: h.token)
        return Leader(holder.identity or "", holder.token, holder.since), holder.expires_at

    def _publish(self, key: str) -> None:
        leader, expires_at = self._leader(key)
        if self._published.get(key, _UNSEEN) != leader:
            self._published[key] = leader
            for watch in list(self._watches.get(key, ())):
                watch.push(leader, expires_at)

    def watch(self, key: str, watch: LeaderListener) -> tuple[Leader | None, float | None]:
        """Tell ``watch`` every change of the leader of ``key`` from now on; the leader now."""
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)  # (tells the key's other watches, if it changes anything)
            leader, expires_at = self._leader(key)
            self._published.setdefault(key, leader)
            self._watches.setdefault(key, weakref.WeakSet()).add(watch)
            return leader, expires_at

    def unwatch(self, key: str, watch: LeaderListener) -> None:
        with self._mutex:
            watches = self._watches.get(key)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[key]
                    self._published.pop(key, None)

    def look(self, key: str) -> float | None:
        """Drop an expired leader of ``key`` (its watches hear of it); when the leader's hold expires now."""
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)
            if key in self._watches:
                self._publish(key)
            return self._leader(key)[1]

    def leader(self, key: str) -> Leader | None:
        with self._mutex:
            res = self._resources.get(key)
            if res is not None:
                self._grant(key, res, _clock(), 1)
            return self._leader(key)[0]

    def try_enter(self, key: str, req: _Request, permits: int, wait: bool) -> int | None:
        """Take it now (the token), or queue ``req`` when ``wait`` (None: not granted yet)."""
        now = _clock()
        with self._mutex:
            res = self._resource(key, permits)
            if res.permits != permits:
                raise _PermitsDiffer(res.permits)
            self._grant(key, res, now, permits)
            res = self._resource(key, permits)
            holder = res.holders.get(req.hold)
            if holder is not None:
                holder.expires_at = now + req.ttl
                return holder.token
            if not res.queue and self._fits(res, req.mode, permits):
                token = next(self._tokens)
                res.holders[req.hold] = _Holder(req.mode, 1, token, now + req.ttl, req.identity, time.time())
                if key in self._watches:
                    self._publish(key)
                return token
            if wait:
                res.queue.append(req)
            else:
                self._grant(key, res, now, permits)  # drops the resource if it is empty
            return None

    def poll(self, key: str, req: _Request, permits: int) -> tuple[int | None, float | None]:
        """(token if granted, seconds until the earliest holder expires)."""
        now = _clock()
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return req.token, None
            self._grant(key, res, now, permits)
            if req.token is not None:
                return req.token, None
            ends = [holder.expires_at for holder in res.holders.values()]
            return None, (min(ends) - now if ends else None)

    def leave(self, key: str, req: _Request, permits: int) -> int | None:
        """Stop waiting: out of the queue, or the token if it was granted meanwhile."""
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return req.token
            if req in res.queue:
                res.queue.remove(req)
            self._grant(key, res, _clock(), permits)  # those behind it may go now
            return req.token

    def update(self, key: str, hold: str, ttl: float, permits: int, count: int | None = None) -> bool:
        now = _clock()
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return False
            self._grant(key, res, now, permits)
            holder = res.holders.get(hold)
            if holder is None:
                return False
            holder.expires_at = now + ttl
            if count is not None:
                holder.count = count
            return True

    def release(self, key: str, hold: str, permits: int) -> bool:
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return False
            found = res.holders.pop(hold, None) is not None
            self._grant(key, res, _clock(), permits)
            return found

    def expire(self, key: str) -> bool:
        """Drop every holder of ``key`` (no hand-over until someone looks again)."""
        return bool(self.take(key))

    def take(self, key: str) -> list[str]:
        """Drop every holder of ``key`` (no hand-over until someone looks again); the holds it had."""
        with self._mutex:
            res = self._resources.get(key)
            if res is None or not res.holders:
                return []
            holds = list(res.holders)
            res.holders.clear()
            if key in self._watches:
                self._publish(key)
            return holds

    def snapshot(self, key: str, permits: int) -> tuple[list[tuple[str, _Holder]], int]:
        with self._mutex:
            res = self._resources.get(key)
            if res is None:
                return [], 0
            self._grant(key, res, _clock(), permits)
            holders = sorted(res.holders.items(), key=lambda item: item[1].expires_at)
            return [(hold, _Holder(h.mode, h.count, h.token, h.expires_at, h.identity)) for hold, h in holders], len(
                res.queue
            )

    def held_keys(self) -> list[str]:
        now = _clock()
        with self._mutex:
            return [
                key
                for key, res in self._resources.items()
                if any(holder.expires_at > now for holder in res.holders.values())
            ]


def _wake(req: _Request) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is req.loop:
        req.event.set()
    elif not req.loop.is_closed():
        req.loop.call_soon_threadsafe(req.event.set)


_QUEUES = _QueueTable()


def _queue_key(prefix: str, kind: str, name: str) -> str:
    return f"{prefix}:{name}#{kind}"
