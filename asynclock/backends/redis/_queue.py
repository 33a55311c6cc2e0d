"""The client's side of a queue kept on the server: hand-over messages and the queued holds.

When a release hands a lock to a queued hold, the server publishes
``"<hold> <token>"`` on a channel that only the hold's client listens to
(:class:`Handovers`, one channel per client): its client owns the lock when
the message arrives, and nobody else is woken. A queued hold keeps its queue
entry alive by polling (the entry expires by the server's clock a ttl after
the waiter's last request); a poll also finds a hand-over whose message was
lost. :class:`Waiting` is one such hold, with the pace of its polls.

The queues themselves (what the requests do on the server, ``_exclusive.py``
and ``_shared.py``) answer :class:`Entered`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import NamedTuple

from ...abc import LockRef
from ._pubsub import PubSub

__all__ = ["Entered", "Handovers", "Ticket", "Tickets", "Waiting"]


class Entered(NamedTuple):
    """What one acquire request (a try, or a queued hold's poll) got.

    ``token``: the hold holds the lock now, with this fencing token (None: it
    does not). ``head``: for a queued hold at the head of the queue, seconds
    until the current holder's lease ends (-1: no holder); None for a hold
    further back, or one that is not queued. ``entry``: the hold's queue
    entry as the server wrote it, where the queue finds entries by it (its
    next poll or leave names it).
    """

    token: int | None
    head: float | None = None
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

    async def ready(self) -> None:
        """Make sure the channel is subscribed before a hold can be queued (once per client).

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


@dataclass(slots=True, eq=False)
class Waiting:
    """A hold of this client that waits in a server's queue.

    ``queued_at``: the send time of the last request the server answered
    "still queued". A hand-over (by another client's release, or by a script
    that found the holder expired) happens after that request was served,
    hence after it was sent, and sets the hold's expiry from that moment:
    counting the lease from this send time is conservative, whichever way
    the news arrives. ``poll_at``: when the hold must poll, to keep its entry
    alive (a third of its ttl) or, at the head, when the holder's lease ends.
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
        if entered.head is not None and entered.head >= 0:
            pause = min(pause, entered.head + 0.002)
        self.poll_at = sent + pause
        return pause
