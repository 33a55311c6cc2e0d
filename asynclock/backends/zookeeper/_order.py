"""Who holds: which children are contenders, their order, and each primitive's rule.

Every child whose name ends in a 10-digit sequence number is a contender,
whoever wrote it (Curator ``_c_…-lock-N``, kazoo ``…__lock__N``), ordered by
that number. The lowest holds (a reader: when no writer is ahead; a
semaphore's lease: when among the first ``permits``); every other contender
watches only the node its rule names (no herd).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ._layout import WRITE

__all__ = ["Rule", "contenders_of", "first_holds", "reader_holds", "rw_holders", "sequence"]

#: What makes a child a contender: a 10-digit sequence number at the end.
_SEQUENCE = re.compile(r"(\d{10})$")

#: Given the contenders (in order) and our node's name: do we hold, and which node to watch.
Rule = Callable[[list[str], str], tuple[bool, str | None]]


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
