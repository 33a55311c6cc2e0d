"""Leader elections on one Redis server: the exclusive lock's line, under keys of their own.

An election ``N`` is the exclusive lock of ``_exclusive.py`` under the keys
``<prefix>:{N}:e`` (X: the leader's hold) and ``<prefix>:{N}:e:q`` (Q: the
candidates in line): candidates queue first come first served, the release
script hands leadership to the head of the line, and a leader's token is
larger than every earlier one's. What an election adds:

* The candidate's identity travels with its hold: the hold the scripts see
  is ``<hold id>/<identity, percent-encoded>`` (:func:`server_hold`; no
  space, as queue entries need), so X names the leader, and a hand-over
  carries the identity with it.
* The scripts publish X's value on the channel ``<prefix>:{N}:e`` (a
  pub/sub channel of the same name as X) whenever the holder changes: a new
  leader (taken, handed over, served after an expiry) or nobody (a release
  with nobody in line). A leader whose client died expires with no message:
  an observer reads again when the leader's hold would expire.

On Redis Cluster every key and channel of an election shares its ``{N}``
hash tag, so one slot (one node) serves them all: the scripts SPUBLISH on
the election's shard channel ``<prefix>:{N}:e``, and hand leadership over
on the shard channel ``<prefix>:{N}:e:w:<client id>`` of the next
candidate's client, which that client subscribes on the slot's node while
it has a candidate in line (``_exclusive.py``, ``_shards.py``).

An observer (:class:`RedisLeaderWatch`) subscribes to the election's
channel before its first read, and reads again after each message, after
the connection's every resubscription (messages may have been missed
meanwhile), and when the leader's hold would expire. Terms that begin and
end between two of its reads are seen as one change. Redis keeps no record
of when a term began: a leader's ``since`` is None.
"""

from __future__ import annotations

import weakref
from typing import Protocol
from urllib.parse import quote, unquote

from ..._values import Leader
from ...abc import LockRef
from .._reread import RereadWatch
from ._exclusive import ExclusiveLock
from ._pubsub import OnMessage, OnResync

__all__ = ["Elections", "RedisLeaderWatch", "Router", "hold_of", "server_hold"]

#: A moment past a hold's expiry, when an observer looks again (seconds).
_PAST = 0.002


def server_hold(hold: str, identity: str | None) -> str:
    """The hold of a candidate as the scripts see it: its hold id and identity, without spaces."""
    return f"{hold}/{quote(identity or '', safe='')}"


def hold_of(holder: str) -> tuple[str, str]:
    """The hold id and the identity of a candidate's hold as the scripts see it."""
    hold, _, identity = holder.partition("/")
    return hold, unquote(identity)


class Router(Protocol):
    """What delivers a channel's messages: a server's pub/sub connection (``_pubsub.PubSub``),
    or a Cluster's shard connections (``_shards.ShardListener``)."""

    async def route(
        self, channel: str, on_message: OnMessage, on_resync: OnResync, *, wait_connect: bool = False
    ) -> None: ...

    def forget(self, channel: str) -> None: ...


class Elections:
    """The elections of one server (or Cluster) for a client: the line (an
    :class:`ExclusiveLock`) and the observers."""

    def __init__(self, lock: ExclusiveLock, pubsub: Router) -> None:
        #: the candidates' line and the leader's hold
        self.lock = lock
        self._pubsub = pubsub
        self._observers: dict[str, weakref.WeakSet[RedisLeaderWatch]] = {}

    async def leader(self, ref: LockRef) -> tuple[Leader, float | None] | None:
        """The leader, and the seconds until its hold expires (None: it does not); one read."""
        held = await self.lock.leader(ref)
        if held is None:
            return None
        holder, token, left = held
        return Leader(hold_of(holder)[1], token, None), left

    async def join(self, watch: RedisLeaderWatch) -> None:
        """Route the election's channel to ``watch`` (subscribed, or bounded: subscribed later, and
        the watch woken then)."""
        channel = watch.channel
        observers = self._observers.get(channel)
        if observers is None:
            observers = self._observers[channel] = weakref.WeakSet()
        observers.add(watch)
        # (every observer asks, so none reads before the subscription is in effect; a
        # refused connection raises ConfigurationError here)
        await self._pubsub.route(channel, lambda _: self._wake(channel), lambda: self._wake(channel), wait_connect=True)

    def leave(self, watch: RedisLeaderWatch) -> None:
        """``watch`` stops observing; the last observer of an election stops its messages (no I/O:
        the connection stays subscribed, and drops the election's messages)."""
        channel = watch.channel
        observers = self._observers.get(channel)
        if observers is None:
            return
        observers.discard(watch)
        if not observers:
            del self._observers[channel]
            self._pubsub.forget(channel)

    def _wake(self, channel: str) -> None:
        for watch in list(self._observers.get(channel, ())):
            watch.wake()


class RedisLeaderWatch(RereadWatch):
    """The leader of one election after each change (``Elects.observe``): a read after each
    message of the election's channel, each resubscription, and each expiry of the leader's hold."""

    def __init__(self, elections: Elections, ref: LockRef) -> None:
        super().__init__()
        self._elections = elections
        self._ref = ref
        #: the election's pub/sub channel (the name of its X)
        self.channel = elections.lock.key(ref.name)

    async def _join(self) -> None:
        await self._elections.join(self)

    def _leave(self) -> None:
        self._elections.leave(self)

    async def _read(self) -> tuple[Leader | None, float | None]:
        found = await self._elections.leader(self._ref)
        if found is None:
            return None, None
        leader, left = found
        # the leader's hold expires with no message: look again just past that
        return leader, None if left is None else left + _PAST
