"""Who owns a hold: the running asyncio task, or nobody (a detached lease)."""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any

_task_ids: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_task_counter = itertools.count(1)
_detached_counter = itertools.count(1)


def current_owner() -> str:
    """The owner id of the running task (unique for the process's lifetime)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("asynclock locks are owned by asyncio tasks: call this from inside a task")
    number = _task_ids.get(task)
    if number is None:
        number = _task_ids[task] = next(_task_counter)
    return f"task-{number}"


def detached_owner() -> str:
    """A new owner id that belongs to no task (``acquire(detached=True)``)."""
    return f"detached-{next(_detached_counter)}"
