"""One acquisition's state on its lease connection: what its session did, so that giving it back undoes exactly that."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...abc import LockRef
from . import _sql

__all__ = ["Hold", "ms"]


def ms(seconds: float) -> str:
    """Seconds as a server setting's value in ms, rounded up and never 0 (0 would mean 'no limit')."""
    return str(max(1, math.ceil(seconds * 1000)))


@dataclass(eq=False, slots=True)
class Hold:
    """An acquisition of ``ref`` for the hold id ``hold``: queued, trying, waiting or granted.

    It owns a place among the backend's lease connections (``has_place``) and,
    once it has one, a connection (``conn``) whose session takes the lock.
    """

    ref: LockRef
    hold: str
    ttl: float
    has_place: bool = False
    conn: Any = None  # an asyncpg pool connection
    #: The lock statement's parameters before lock_timeout (and, for a semaphore, the head flag).
    args: tuple[Any, ...] = ()
    #: A lock statement was sent: something may be locked or set.
    dirty: bool = False
    #: The settings the grant replaced (application_name, idle_session_timeout).
    before: tuple[str, str | None] | None = None
    #: client_connection_check_interval was set for this wait.
    reset_check: bool = False
    #: A semaphore's channel: giving the connection back NOTIFYs its head waiter.
    notify: str | None = None
    #: LISTENing on that channel (the head waiter) with this callback, which sets ``notified``.
    listener: Callable[..., None] | None = field(default=None, repr=False)
    notified: asyncio.Event | None = field(default=None, repr=False)
    #: A semaphore's waiter holds the gate: it is the head of the queue.
    at_gate: bool = False
    granted: bool = False
    token: int | None = None
    count: int = 1
    lost: bool = False
    released: bool = False
    ping: asyncio.Task[Any] | None = field(default=None, repr=False)
    on_close: Callable[[Any], None] | None = field(default=None, repr=False)

    def listening(self) -> tuple[str, Callable[..., None]] | None:
        """The (channel, callback) this session LISTENs with, if it does."""
        if self.notify is None or self.listener is None:
            return None
        return self.notify, self.listener

    def forget_session(self) -> None:
        """The connection is gone (its session ended, and with it everything it held or set)."""
        self.conn = None
        self.dirty = self.reset_check = self.at_gate = False
        self.before = None
        self.listener = self.notified = None

    def cleanup(self, pg14: bool) -> tuple[str | None, tuple[Any, ...]]:
        """The statement (and its parameters) that gives the connection back in a known state.

        A grant that changed nothing but its settings is undone by one
        prepared statement; anything else by a list of resets (simple
        protocol: one round trip). None: nothing was sent, nothing to undo.
        """
        if not self.dirty:
            return None, ()
        if self.before is not None and not self.reset_check:
            if self.notify is not None:
                return _sql.RELEASE_NOTIFY, (*self.before, self.notify)
            return _sql.RELEASE, self.before
        parts = [_sql.CLEANUP_PARTS["unlock"], _sql.CLEANUP_PARTS["app"]]
        if pg14:
            parts.append(_sql.CLEANUP_PARTS["idle"])
        if self.reset_check:
            parts.append(_sql.CLEANUP_PARTS["check"])
        if self.notify is not None:
            # A permit (or the head's place) is given back: the head waiter tries again.
            parts.append(_sql.CLEANUP_PARTS["notify"].format(channel=self.notify))
        return "; ".join(parts), ()
