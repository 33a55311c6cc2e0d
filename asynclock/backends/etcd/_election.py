"""Who leads an etcd election (``concurrency.Election``): one read, and a watch of the line.

The leader is the candidate key with the lowest create revision under the
election's prefix (:mod:`._recipe`): its value is the candidate's identity
(Go's proposal, ``etcdctl elect``'s too), its create revision the term's
fencing token. etcd keeps no record of when a key became the lowest, so a
leader's ``since`` is None.

An observer watches the whole prefix, puts and deletes, from now on; once
etcd confirmed the watch it reads every candidate, at a revision no older
than the watch's start. From then on it applies the watch's events after
that revision, one revision at a time, and tells each new leader they make.
So it sees every term, even one that begins and ends while its reader is
busy, as long as the watch lasts; a lost watch (the stream broke, a member
failed) starts it again: a new watch, a new read. Go's ``Observe`` watches
only the current leader's key and reads the first key again after its
deletion, so it may skip a term that comes and goes meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from ..._values import Leader
from ._client import EtcdClient
from ._errors import EtcdUnavailable
from ._replies import DELETE, Event, KeyValue
from ._session import Session
from ._watch import Watch
from ._wire import ASCEND, SORT_CREATE, prefix_end, range_request

__all__ = ["EtcdLeaderWatch", "read_leader"]


def _leader_of(kv: KeyValue | None) -> Leader | None:
    return None if kv is None else Leader(kv.value.decode("utf-8", "replace"), kv.create_revision, None)


async def read_leader(client: EtcdClient, election_key: str, timeout: float) -> Leader | None:
    """The leader of the election at ``election_key``: the first candidate by create revision, one read."""
    directory = f"{election_key}/".encode()
    request = range_request(directory, prefix_end(directory), limit=1, sort_order=ASCEND, sort_target=SORT_CREATE)
    answer = await client.range(request, timeout)
    return _leader_of(answer.kvs[0] if answer.kvs else None)


class EtcdLeaderWatch:
    """The leader of one election after each change (``Elects.observe``), from a watch of its prefix.

    Runs in the caller's task; ``close()`` drops the watch (etcd is told in
    the background). Errors are asynclock's; the front retries them.
    """

    def __init__(self, client: EtcdClient, session: Session, election_key: str) -> None:
        self._client = client
        self._session = session
        self._dir = f"{election_key}/".encode()
        self._watch: Watch | None = None
        # every candidate as of ``_revision``, by key
        self._candidates: dict[bytes, KeyValue] = {}
        self._revision = 0
        # the last leader told, and those found since and not told yet
        self._leader: Leader | None = None
        self._news: deque[Leader | None] = deque()

    async def next(self) -> Leader | None:
        while True:
            if self._news:
                return self._news.popleft()
            watch = self._watch
            if watch is None or watch.fired.is_set():
                return await self._start()
            assert watch.events is not None
            if watch.events:
                self._apply(watch.events)
                continue
            watch.changed.clear()
            await watch.changed.wait()

    async def _start(self) -> Leader | None:
        """Watch the prefix from now, then read every candidate: the leader now."""
        self.close()
        client = self._client
        window = self._session.window()
        end = prefix_end(self._dir)
        watch = self._watch = await client.watch(self._dir, 0, window, end, events=True)
        try:
            try:
                async with asyncio.timeout(window):
                    await watch.confirmed.wait()
            except TimeoutError:
                raise EtcdUnavailable(f"etcd at {client.current} did not confirm a watch in time") from None
            if watch.fired.is_set():
                raise EtcdUnavailable(f"the watch of an election at {client.current} was lost")
            answer = await client.range(
                range_request(self._dir, end, sort_order=ASCEND, sort_target=SORT_CREATE), window
            )
        except BaseException:
            self.close()
            raise
        self._revision = answer.header.revision
        self._candidates = {kv.key: kv for kv in answer.kvs}
        self._news.clear()
        self._leader = _leader_of(answer.kvs[0] if answer.kvs else None)
        return self._leader

    def _apply(self, events: deque[Event]) -> None:
        """Take ``events`` (those after the read), revision by revision, noting each new leader."""
        revision = 0
        while events:
            event = events.popleft()
            kv = event.kv
            if kv.mod_revision <= self._revision:
                continue  # (the read has it)
            if revision and kv.mod_revision != revision:
                self._note()
            revision = kv.mod_revision
            if event.type == DELETE:
                self._candidates.pop(kv.key, None)
            else:
                self._candidates[kv.key] = kv
        if revision:
            self._revision = revision
            self._note()

    def _note(self) -> None:
        leader = _leader_of(_first(self._candidates.values()))
        if leader != self._leader:
            self._leader = leader
            self._news.append(leader)

    def close(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and not watch.fired.is_set():
            self._client.unwatch(watch)


def _first(candidates: Iterable[KeyValue]) -> KeyValue | None:
    return min(candidates, key=lambda kv: kv.create_revision, default=None)
