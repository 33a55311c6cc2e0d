"""The turns of a client's tasks at its one key of a lock.

etcd's Mutex (and its Election) keys a contender by its lease: a client has
one key per lock. asynclock's owners are tasks, so the tasks of one client
take turns for that key here, first come first served; each turn creates
the key anew (:mod:`._queue`), so each holder gets a fencing token of its
own and a place behind the other clients that queued meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib

from ._node import Node, Slot

__all__ = ["Turns"]


class Turns:
    """Which task of this client has its key of each lock, and which wait for it, in order."""

    def __init__(self) -> None:
        self._slots: dict[str, Slot] = {}

    def take(self, node: Node) -> bool:
        """Give ``node`` its client's key of its lock if no other task of the client has it."""
        assert node.turns is not None
        slot = self._slots.get(node.turns)
        if slot is None:
            slot = self._slots[node.turns] = Slot()
        if slot.owner is not None and slot.owner != node.hold:
            return False
        slot.owner = node.hold
        node.slot = slot
        return True

    def join(self, node: Node) -> None:
        """Queue ``node`` for its lock's key behind the other tasks of this client."""
        assert node.turns is not None
        slot = self._slots[node.turns]
        node.turn = asyncio.get_running_loop().create_future()
        node.slot = slot
        slot.queue.append((node.hold, node.turn))

    async def wait(self, node: Node, until: float | None) -> bool:
        """Wait for ``node``'s turn, at most until the loop time ``until``; whether it came."""
        turn = node.turn
        assert turn is not None
        if not turn.done():
            timeout = None if until is None else max(0.0, until - asyncio.get_running_loop().time())
            await asyncio.wait((turn,), timeout=timeout)  # (cancelling the caller leaves the turn as it is)
            if not turn.done():
                return False
        node.turn = None
        return True

    def leave(self, node: Node) -> None:
        """``node`` stops waiting for its turn (a turn handed to it meanwhile goes on to the next)."""
        turn, node.turn = node.turn, None
        slot, node.slot = node.slot, None
        if slot is None or turn is None:
            return
        with contextlib.suppress(ValueError):
            slot.queue.remove((node.hold, turn))
        if turn.done() or slot.owner == node.hold:
            self._next(node.turns, slot)

    def pass_on(self, node: Node) -> None:
        """``node``'s key is gone: the next task's turn."""
        slot, node.slot = node.slot, None
        if slot is not None and slot.owner == node.hold:
            self._next(node.turns, slot)

    def _next(self, key: str | None, slot: Slot) -> None:
        slot.owner = None
        while slot.queue:
            hold, turn = slot.queue.popleft()
            if not turn.done():
                slot.owner = hold
                turn.set_result(None)
                return
        if key is not None and self._slots.get(key) is slot:
            del self._slots[key]

    def waiting(self, key: str) -> int:
        """Tasks of this client that wait for their turn at the lock ``key``."""
        slot = self._slots.get(key)
        return 0 if slot is None else len(slot.queue)
