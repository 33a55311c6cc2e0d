"""What a client tells its ``on_event`` callback: one place that makes and delivers a :class:`LockEvent`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ._values import EventKind, LockEvent, LossReason

__all__ = ["EventCallback", "Events"]

logger = logging.getLogger("asynclock")

EventCallback = Callable[[LockEvent], object]


class Events:
    """The events of one client: made only when somebody listens, delivered in a later loop turn.

    Delivery is a loop callback, so the callback never runs inside the
    operation it reports (it cannot cut an acquire or a release short), and
    an exception it raises is logged, not propagated.
    """

    __slots__ = ("callback", "client_id")

    def __init__(self, client_id: str, callback: EventCallback | None) -> None:
        self.client_id = client_id
        self.callback = callback

    def emit(
        self,
        kind: EventKind,
        name: str,
        owner: str,
        token: int | None,
        *,
        wait_s: float | None = None,
        held_s: float | None = None,
        reason: str | None = None,
        loss: LossReason | None = None,
    ) -> None:
        """Report ``kind`` for the lock ``name`` held (or wanted) by ``owner``; nothing when nobody listens."""
        if self.callback is None:
            return
        event = LockEvent(kind, name, f"{self.client_id}:{owner}", token, wait_s, held_s, reason, loss)
        asyncio.get_running_loop().call_soon(self._deliver, event)

    def _deliver(self, event: LockEvent) -> None:
        assert self.callback is not None
        try:
            self.callback(event)
        except Exception:
            logger.exception("on_event callback failed for %s", event)
