"""A backend's background work: one registry of its tasks, and one way to
retry a clean-up until it is done or no longer matters.

A clean-up (delete a node, leave a queue, settle a request cut short) must
not hold up the caller it belongs to, and must not outlive the backend:
``Background.spawn`` starts it in a task the registry keeps, and
``Background.aclose`` lets the tasks finish within a bound, then cancels the
rest. :func:`until_done` is the loop most clean-ups are: try, and on a
failure to reach the server pause (with backoff) and try again, until the
step says it is done or the work is moot (the session it belonged to is
over, the backend is closing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .._errors import LockError
from .._timing import Backoff

__all__ = ["Background", "until_done"]


class Background:
    """The background tasks of one backend (or one part of it)."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in a task of its own, kept until it ends (its outcome is retrieved then)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a clean-up's failure is its own to report

    def cancel(self) -> None:
        """Cancel every task now (no waiting)."""
        for task in self._tasks:
            task.cancel()

    async def aclose(self, within: float) -> None:
        """Let the tasks finish for at most ``within`` seconds, then cancel the rest and wait for them to end."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=within)
        if self._tasks:
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)


async def until_done(
    step: Callable[[], Awaitable[bool]],
    *,
    moot: Callable[[], bool],
    backoff: Backoff | None = None,
    retry: tuple[type[BaseException], ...] = (LockError, OSError, TimeoutError),
) -> bool:
    """Run ``step`` until it returns True (done: True is returned) or ``moot()`` turns true (False).

    A step that raises one of ``retry`` (the server could not be reached, or
    did not answer in time) or returns False (not yet) is tried again after a
    pause from ``backoff``; anything else ends the loop by propagating.
    """
    pauses = Backoff() if backoff is None else backoff
    while not moot():
        try:
            if await step():
                return True
        except retry:
            pass
        if moot():
            break
        await asyncio.sleep(pauses.next())
    return False
