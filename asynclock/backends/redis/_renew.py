"""Renewing many holds of one server at once: script calls of at most ``RENEW_CHUNK`` holds.

One script call renews a whole chunk and answers one flag per hold. A call
that fails fails its chunk alone: READONLY (a replica, or a primary demoted
by a failover) means none of its holds is held there any more; any other
error is the chunk's result, which the lease keeper retries until each
lease's deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ..._errors import BackendUnavailable, LockError
from ...abc import RenewItem
from ._connection import Connection, Script, is_readonly

__all__ = ["RENEW_CHUNK", "chunks", "renew_failed", "renew_in_chunks"]

#: Holds renewed by one script call (a bound on its keys, and on the time the server spends in it).
RENEW_CHUNK = 1000

T = TypeVar("T")

#: One chunk's keys and arguments for the renew script.
Encode = Callable[[Sequence[RenewItem]], tuple[list[str], list[str | int]]]


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in runs of ``RENEW_CHUNK``, in order."""
    for start in range(0, len(items), RENEW_CHUNK):
        yield items[start : start + RENEW_CHUNK]


def renew_failed(exc: BaseException) -> bool | BaseException:
    """A failed renewal call as the result of each of its holds: False (not held) after
    READONLY, else the error itself."""
    cause = exc.__cause__
    return False if isinstance(exc, BackendUnavailable) and cause is not None and is_readonly(cause) else exc


async def renew_in_chunks(
    connection: Connection, script: Script, items: Sequence[RenewItem], encode: Encode
) -> list[bool | BaseException]:
    """Renew ``items`` with ``script``, one call per chunk (``encode`` makes its keys and
    arguments), one after the other; a result per item, in order (see :func:`renew_failed`)."""
    results: list[bool | BaseException] = []
    for chunk in chunks(items):
        keys, args = encode(chunk)
        try:
            answer = await connection.run(script, keys, args)
        except LockError as exc:
            results += [renew_failed(exc)] * len(chunk)
            continue
        results += [bool(flag) for flag in answer]
    return results
