"""Who owns a hold: the running asyncio task, or nobody (a detached lease)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

#: The owner id of each task that has asked for one, until the task is done.
_owners: dict[asyncio.Task[Any], str] = {}
_task_counter = itertools.count(1)
_detached_counter = itertools.count(1)


def current_owner() -> str:
    """The owner id of the running task (unique for the process's lifetime)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("asynclock locks are owned by asyncio tasks: call this from inside a task")
    owner = _owners.get(task)
    if owner is None:
        owner = _owners[task] = f"task-{next(_task_counter)}"
        task.add_done_callback(_forget)
    return owner


def _forget(task: asyncio.Task[Any]) -> None:
    _owners.pop(task, None)


def detached_owner() -> str:
    """A new owner id that belongs to no task (``acquire(detached=True)``)."""
    return f"detached-{next(_detached_counter)}"
