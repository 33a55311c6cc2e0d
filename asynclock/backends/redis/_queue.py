"""The client's side of a queue kept on the server: hand-over messages and the queued holds.

When a release hands a lock to a queued hold, the server publishes
``"<hold> <token>"`` on a channel that only the hold's client listens to
(:class:`Handovers`, one channel per client on one server; on a Cluster one
shard channel per election, ``_shards.ShardHandovers``): its client owns the
lock when the message arrives, and nobody else is woken. A queued hold keeps
its queue entry alive by polling (the entry expires by the server's clock a
ttl after the waiter's last request); a poll also finds a hand-over whose
message was lost. :class:`Waiting` is one such hold, with the pace of its
polls.

:class:`QueueClient` is that client side, written once for the single server
(and Sentinel) and for Cluster's elections: the acquire that may queue a
hold, the wait for its hand-over or its next poll, and its leave. The queues
themselves (what the requests do on the server, ``_exclusive.py`` and
``_shared.py``) answer :class:`Entered`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._errors import BackendUnavailable, ConfigurationError
from ...abc import Acquired, Busy, LockRef, Queued
from ._connection import Connection
from ._pubsub import PubSub

__all__ = ["Entered", "HandoverRoute", "Handovers", "Queue", "QueueClient", "Ticket", "Tickets", "Waiting"]


class Entered(NamedTuple):
    """What one acquire request (a try, or a queued hold's poll) got.

    ``token``: the hold holds the lock now, with this fencing token (None: it
    does not). ``lease_left``: for a queued hold, seconds until the current
    holder's lease ends (None: no holder, or not queued). Every waiter polls
    then, not only the head: when the holder and the head both died, the
    first live waiter's poll serves the queue, passing over the dead. ``entry``: the hold's queue
    entry as the server wrote it, where the queue finds entries by it (its
    next poll or leave names it).
    """

    token: int | None
    lease_left: float | None = None
    entry: bytes = b""


class Ticket:
    """A hold's slot for its hand-over message, registered before the request that may queue it.

    ``token``: the hand-over's, once it arrived. The future a waiter sleeps on
    is made only when one does (most acquires are never queued).
    """

    __slots__ = ("_sleeping", "_woken", "token")

    def __init__(self) -> None:
        self.token: int | None = None
        self._woken = False
        self._sleeping: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """The hand-over arrived, or the client must look again."""
        self._woken = True
        sleeping = self._sleeping
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)

    def clear(self) -> None:
        """Forget a wake-up (before a request that looks again)."""
        self._woken = False

    async def wait(self, until: float) -> None:
        """Until a wake-up, or the loop time ``until``."""
        if self._woken:
            return
        loop = asyncio.get_running_loop()
        sleeping = self._sleeping = loop.create_future()
        # (a timer that ends the sleep, rather than a timeout that cancels it:
        # the hand-over's path is one future and nothing to undo)
        timer = loop.call_at(until, _end_sleep, sleeping)
        try:
            await sleeping
        finally:
            timer.cancel()
            self._sleeping = None


def _end_sleep(sleeping: asyncio.Future[None]) -> None:
    if not sleeping.done():
        sleeping.set_result(None)


class Tickets:
    """The holds of this client that expect a hand-over message ``"<hold> <token>"``."""

    def __init__(self) -> None:
        self._tickets: dict[str, Ticket] = {}

    def expect(self, hold: str) -> Ticket:
        """The slot for ``hold``'s hand-over (the one it has, if any)."""
        ticket = self._tickets.get(hold)
        if ticket is None:
            ticket = self._tickets[hold] = Ticket()
        return ticket

    def forget(self, hold: str) -> None:
        self._tickets.pop(hold, None)

    def handle(self, payload: bytes) -> None:
        hold, _, token = payload.decode("utf-8", "replace").rpartition(" ")
        ticket = self._tickets.get(hold)
        if ticket is not None and token.isdigit():
            ticket.token = int(token)
            ticket.wake()

    def resync(self) -> None:
        """Messages may have been missed (or the channel was refused): every queued hold looks again."""
        for ticket in self._tickets.values():
            ticket.wake()


class Handovers(Tickets):
    """This client's one channel for hand-over messages, and the holds that expect one."""

    def __init__(self, channel: str, pubsub: PubSub) -> None:
        super().__init__()
        self.channel = channel
        self._pubsub = pubsub
        self._routing: asyncio.Task[None] | None = None

    async def listen(self, name: str, hold: str) -> None:
        """Make sure the channel is subscribed before a hold can be queued (once per client:
        the one channel serves every lock ``name`` and ``hold``).

        Raises ConfigurationError if the server refuses the pub/sub connection.
        """
        routing = self._routing
        refused = self._pubsub.failure is not None
        subscribed = routing is not None and routing.done() and not routing.cancelled() and routing.exception() is None
        if subscribed and not refused:
            return
        # (once refused, each new queued hold tries again, and meets the refusal itself)
        if routing is None or routing.done() or refused:
            routing = self._routing = asyncio.get_running_loop().create_task(
                self._pubsub.route(self.channel, self.handle, self.resync), name="asynclock-redis-route"
            )
        await asyncio.shield(routing)

    def done(self, name: str, hold: str) -> None:
        """``hold`` expects no hand-over any more (the channel stays: other holds may use it)."""
        self.forget(hold)

    def raise_failure(self) -> None:
        """Raise the refusal that stopped the pub/sub connection, if one did (ConfigurationError)."""
        self._pubsub.raise_failure()


@dataclass(slots=True, eq=False)
class Waiting:
    """A hold of this client that waits in a server's queue.

    ``queued_at``: the send time of the last request the server answered
    "still queued". A hand-over whose message arrives after that answer (by
    another client's release, or by a script that found the holder expired)
    happened after that request was served, hence after it was sent, and set
    the hold's expiry from that moment: counting the lease from this send
    time is conservative. (A message held up longer than its grant could
    live dies with its pub/sub connection, whose health check replaces a
    connection silent for a third of a ttl.) A message that arrives while a
    request is out may be older than the answer: handed over, then expired
    before the request ran. It is not trusted (see
    :meth:`QueueClient.wait_queued`). ``poll_at``: when the hold must poll,
    to keep its entry alive (a third of its ttl) or when the holder's lease
    ends, if sooner.
    """

    ref: LockRef
    ttl: float
    ticket: Ticket
    queued_at: float
    poll_at: float
    entry: bytes = b""

    def queued(self, sent: float, entered: Entered) -> float:
        """The server answered "still queued" to a request sent at ``sent``: seconds until the next poll."""
        self.queued_at = sent
        self.entry = entered.entry
        pause = self.ttl / 3
        if entered.lease_left is not None:
            pause = min(pause, entered.lease_left + 0.002)
        self.poll_at = sent + pause
        return pause


class Queue(Protocol):
    """What serves a queued hold's requests on the server (``_exclusive.ExclusiveLock``,
    ``_shared.QueuedResource``). ``entry``: the hold's queue entry as last answered."""

    async def enter(
        self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool, fresh: bool, entry: bytes = b""
    ) -> Entered: ...

    def held(self, ref: LockRef, hold: str, ttl: float, token: int) -> None: ...

    async def release(self, ref: LockRef, hold: str, entry: bytes = b"") -> bool: ...


class HandoverRoute(Protocol):
    """Where this client hears of the hand-overs to its holds (:class:`Handovers` on one
    server, ``_shards.ShardHandovers`` on a Cluster)."""

    async def listen(self, name: str, hold: str) -> None: ...

    def expect(self, hold: str) -> Ticket: ...

    def done(self, name: str, hold: str) -> None: ...

    def raise_failure(self) -> None: ...


class QueueClient:
    """This client's holds in the server's queues: acquire (and queue), wait, poll, leave.

    Each method takes the :class:`Queue` that serves the hold, and the hold as
    the scripts know it. ``handovers`` tells this client of hand-overs.
    """

    __slots__ = ("_connection", "_handovers", "_unsure", "_waiting")

    def __init__(self, connection: Connection, handovers: HandoverRoute) -> None:
        self._connection = connection
        self._handovers = handovers
        # holds of this client that wait in a queue, until granted or released
        self._waiting: dict[str, Waiting] = {}
        # holds whose last request may have gone through unseen (failed, cut short)
        self._unsure: set[str] = set()

    async def try_acquire(
        self, queue: Queue, ref: LockRef, hold: str, ttl: float, *, enqueue: bool
    ) -> Acquired | Busy | Queued:
        """One acquire request: Acquired, Busy (not ``enqueue``), or Queued with the pause until its poll.

        Raises what the request raises: ValueError or ConfigurationError when
        the server refused it (nothing changed there), or the hand-over
        route's refusal (ConfigurationError) before any request.
        """
        handovers = self._handovers
        if enqueue:
            # Subscribed, and the hand-over slot registered, before the request
            # that may queue the hold: a hand-over can follow right after it.
            await handovers.listen(ref.name, hold)
            ticket = handovers.expect(hold)
        fresh = hold not in self._unsure
        sent = asyncio.get_running_loop().time()
        try:
            entered = await queue.enter(ref, hold, ttl, enqueue=enqueue, fresh=fresh)
        except (ValueError, ConfigurationError):
            handovers.done(ref.name, hold)  # refused: nothing changed on the server
            raise
        except BaseException:
            self._unsure.add(hold)  # it may have gone through: a retry looks first
            raise
        if not fresh:
            self._unsure.discard(hold)
        if entered.token is not None:
            if enqueue:
                handovers.done(ref.name, hold)
            return Acquired(entered.token)
        if not enqueue:
            return Busy(None)
        waiting = self._waiting[hold] = Waiting(ref, ttl, ticket, sent, sent)
        return Queued(waiting.queued(sent, entered))

    async def wait_queued(
        self, queue: Queue, ref: LockRef, hold: str, ttl: float, until: float | None
    ) -> Acquired | Queued:
        """Until the hand-over message arrives or the loop time ``until``; then one poll.

        The poll keeps the queue entry alive and finds a hand-over whose
        message was lost; one also follows a resubscription of the hand-over
        channel (messages may have been missed meanwhile). Raises
        BackendUnavailable when the poll is not answered within a ttl, and
        ConfigurationError when the hand-over channel was refused.
        """
        waiting = self._waiting[hold]
        ticket = waiting.ticket
        connection = self._connection
        await ticket.wait(waiting.poll_at if until is None else min(until, waiting.poll_at))
        if ticket.token is not None and not connection.replicas:
            queue.held(ref, hold, ttl, ticket.token)
            return self._granted(ref, hold, Acquired(ticket.token, confirmed_at=waiting.queued_at))
        # (With replicas, a hand-over by another client's release, which no
        # replica has confirmed to us, is confirmed by this request of our own:
        # it finds the hold ours, resets its expiry, and WAITs.)
        if ticket.token is None:
            self._handovers.raise_failure()  # no message can reach this hold
        ticket.clear()
        ticket.token = None
        sent = waiting.poll_at = asyncio.get_running_loop().time()  # (a failed poll is repeated when asked again)
        # Bounded: a server that stops answering (no connection error) fails
        # the poll after a ttl (the entry is gone by then anyway).
        bound = ttl + connection.replica_timeout_ms / 1000 if connection.replicas else ttl
        try:
            async with asyncio.timeout(bound):
                entered = await queue.enter(ref, hold, ttl, enqueue=True, fresh=False, entry=waiting.entry)
        except TimeoutError as exc:
            raise BackendUnavailable(f"{connection.where} did not answer within {bound:.3g} s") from exc
        if entered.token is not None:
            return self._granted(ref, hold, Acquired(entered.token, confirmed_at=sent))  # this request reset the expiry
        # A hand-over message that arrived while this poll was out may announce a
        # grant older than the answer "still queued" (it expired before the poll
        # ran, and another may hold the lock now): it only wakes the hold, whose
        # next poll, at once, confirms a grant that is still its own.
        ticket.token = None
        return Queued(waiting.queued(sent, entered))

    def _granted(self, ref: LockRef, hold: str, acquired: Acquired) -> Acquired:
        del self._waiting[hold]
        self._handovers.done(ref.name, hold)
        return acquired

    def leave(self, ref: LockRef, hold: str) -> bytes:
        """``hold`` is being released (or leaves the queue): its queue entry as last answered (``b""``: none)."""
        self._unsure.discard(hold)
        waiting = self._waiting.pop(hold, None)
        self._handovers.done(ref.name, hold)
        return waiting.entry if waiting is not None else b""

    def clear(self) -> None:
        """The backend is closing: no hold waits any more."""
        self._waiting.clear()
