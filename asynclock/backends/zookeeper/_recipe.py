"""The contender rules: who holds a lock, a read-write lock or a semaphore, and whom a waiter watches.

Every child whose name ends in a 10-digit sequence number is a contender,
whoever wrote it (Curator ``_c_…-lock-N``, kazoo ``…__lock__N``), ordered
by that number.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._layout import LOCK_BASE, WRITE

__all__ = ["Node", "Rule", "Verify", "contenders_of", "first_holds", "reader_holds", "rw_holders", "sequence"]

#: What makes a child a contender: a 10-digit sequence number at the end.
_SEQUENCE = re.compile(r"(\d{10})$")

#: Given the contenders (in order) and our node's name: do we hold, and which node to watch.
Rule = Callable[[list[str], str], tuple[bool, str | None]]
#: Given the contenders (in order) and our new node's name: raise if the queue refuses us.
Verify = Callable[[list[str], str], Awaitable[None]]


def sequence(child: str) -> int | None:
    """The sequence number a contender's name ends in, or None (not a contender)."""
    match = _SEQUENCE.search(child)
    return int(match.group(1)) if match else None


def contenders_of(children: Sequence[str]) -> list[str]:
    """The children that take part in the lock, in the order they hold it."""
    found = [(seq, child) for child in children if (seq := sequence(child)) is not None]
    found.sort()
    return [child for _, child in found]


def first_holds(contenders: list[str], mine: str) -> tuple[bool, str | None]:
    """A mutex (and a writer): the lowest holds; a waiter watches the node just ahead."""
    index = contenders.index(mine)
    return index == 0, None if index == 0 else contenders[index - 1]


def reader_holds(contenders: list[str], mine: str) -> tuple[bool, str | None]:
    """A reader holds when no writer is ahead of it, and watches the nearest writer ahead."""
    writers = [child for child in contenders[: contenders.index(mine)] if WRITE in child]
    return not writers, writers[-1] if writers else None


def rw_holders(contenders: list[str]) -> list[str]:
    """Who holds a read-write lock: the first node if a writer, else the readers before the first writer."""
    holders: list[str] = []
    for child in contenders:
        if WRITE in child:
            return holders or [child]
        holders.append(child)
    return holders


@dataclass(eq=False)
class Node:
    """One acquisition: its contender node and what we know about it."""

    name: str
    hold: str
    dir: str
    guid: str
    #: what follows the GUID in the node's name (the server appends the sequence)
    base: str = LOCK_BASE
    path: str | None = None
    czxid: int | None = None
    session: int = 0
    count: int = 1
    held: bool = False
    gone: bool = False
    releasing: bool = False
    delete_sent: bool = False
    #: a create was sent whose answer never came: the node may exist
    uncertain: bool = False
    #: what the node holds (a semaphore's lease: its permits)
    data: bytes = b""
    create_future: asyncio.Future[Any] | None = None
    #: connection on which the deletion watch of a held node is set
    armed: int = -1
    #: the background deletion of a release that could not finish
    finisher: asyncio.Task[None] | None = None
