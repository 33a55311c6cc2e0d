"""One acquisition's contender key on etcd, and what the client knows of it.

Its life on the server is :mod:`._queue`'s: created under the client's lease,
advanced until it holds, deleted. The node of a Mutex or an Election first
takes its turn at the client's one key of that lock (:mod:`._turns`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._client import Sent
from ._recipe import Contender
from ._session import Lease

__all__ = ["Node", "Slot"]


@dataclass(eq=False)
class Slot:
    """The one Mutex key a client has per lock, and its tasks' turns for it."""

    owner: str | None = None
    queue: deque[tuple[str, asyncio.Future[None]]] = field(default_factory=deque)


@dataclass(eq=False)
class Node:
    """One acquisition's contender key, and what we know of it."""

    name: str
    hold: str
    ttl: float
    #: the contender for a lease id (its key names the lease)
    make: Callable[[int], Contender]
    #: the Mutex prefix whose one key of this client this node takes turns for (plain and fair lock)
    turns: str | None = None
    contender: Contender | None = None
    lease: Lease | None = None
    #: create revision of our key (0: not created, or gone)
    revision: int = 0
    count: int = 1
    held: bool = False
    #: the local turn this node has, or waits for
    slot: Slot | None = None
    turn: asyncio.Future[None] | None = None
    #: a semaphore's mutex, held while its lease key waits
    mutex: Node | None = None
    #: checks what must hold before the key is put (a semaphore's permits, under its mutex)
    verify: Callable[[], Awaitable[None]] | None = None
    #: the create request whose answer is not in yet, and whether a create may have landed unseen
    creating: Sent | None = None
    uncertain: bool = False
    finisher: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Whether the node's lease (and so its key, if it has one) may still exist."""
        return self.lease is not None and not self.lease.gone

    @property
    def has_key(self) -> bool:
        """Whether a key of this node may exist on the server."""
        return self.alive and (self.revision != 0 or self.creating is not None or self.uncertain)
