"""Turns: one request at a time, in the order they asked, without an await for the first.

Shared by backends: a PostgreSQL or MySQL session runs one statement at a time, and a
client sends one request at a time about one lock key; both take turns the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

__all__ = ["Turns"]


class Turns:
    """``busy`` while a request has the turn; the next ones wait in order (FIFO)."""

    __slots__ = ("_next", "busy")

    def __init__(self) -> None:
        self.busy = False
        self._next: collections.deque[asyncio.Future[None]] = collections.deque()

    async def enter(self) -> None:
        """Wait for the turn (at once when nobody has it); :meth:`leave` gives it on."""
        if not self.busy:
            self.busy = True
            return
        turn = asyncio.get_running_loop().create_future()
        self._next.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave()  # the turn came with the cancellation: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._next.remove(turn)
            raise

    def leave(self) -> None:
        """End a turn: the next request in line has it (still busy), else nobody."""
        while self._next:
            turn = self._next.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.busy = False
