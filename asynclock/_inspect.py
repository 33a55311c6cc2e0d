"""``asynclock inspect URL [NAME ...]``: what the server says about locks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict

from ._client import Locks
from ._connect import connect
from ._election import Election
from ._errors import BackendUnavailable
from ._lock import Lock
from ._options import mask_url
from ._values import LockInfo
from .abc import Listable

#: What ``--kind`` may name.
KINDS = ("lock", "fair", "rw", "semaphore", "election")


def handle(locks: Locks, kind: str, name: str) -> Lock | Election:
    """The handle whose ``info()`` shows the primitive ``kind`` of ``name`` (an election's: the leader's identity)."""
    if kind == "lock":
        return locks.lock(name)
    if kind == "fair":
        return locks.lock(name, fair=True)
    if kind == "rw":
        return locks.rw_lock(name).read  # either side shows every holder of the lock
    if kind == "semaphore":
        return locks.semaphore(name, permits=1)  # the count does not change what the server says
    if kind == "election":
        return locks.election(name)
    raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


async def collect(
    url: str, names: Sequence[str], *, prefix: str | None = None, kind: str = "lock", timeout: float = 5.0
) -> list[LockInfo]:
    """LockInfo for each name, or for every plain lock held or waited for under the prefix.

    Raises BackendUnavailable if the server has not answered everything within ``timeout`` seconds.
    """
    locks = connect(url, prefix=prefix, connect_timeout=timeout)
    try:
        async with asyncio.timeout(timeout):
            return await _collect(locks, names, kind)
    except TimeoutError:
        raise BackendUnavailable(f"{mask_url(url)} did not answer within {timeout:g} s") from None
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await locks.aclose()


async def _collect(locks: Locks, names: Sequence[str], kind: str) -> list[LockInfo]:
    async with locks:
        wanted = list(names)
        handle(locks, kind, "probe")  # refuses an unknown kind, or one the backend lacks, before any I/O
        if not wanted:
            backend = locks.backend
            if not isinstance(backend, Listable) or kind != "lock":
                what = "locks" if kind == "lock" else f"{kind} primitives"
                raise ValueError(f"the {backend.scheme} backend cannot list its {what}: name them")
            wanted = sorted(await backend.names())
        return [await handle(locks, kind, name).info() for name in wanted]


def as_json(infos: Sequence[LockInfo]) -> str:
    return json.dumps([{**asdict(info), "held": info.held} for info in infos], indent=2, ensure_ascii=False)


def as_table(infos: Sequence[LockInfo]) -> str:
    if not infos:
        return "no locks held"
    headers = ("NAME", "HOLDER", "HOLDS", "TTL", "WAITERS", "TOKEN", "KEY")
    rows = [headers]
    for info in infos:
        rows.append(
            (
                info.name,
                _holder(info),
                str(info.hold_count) if info.owner else "-",
                "-" if info.ttl is None else f"{info.ttl:.2f}s",
                "-" if info.waiters is None else str(info.waiters),
                "-" if info.token is None else str(info.token),
                info.key,
            )
        )
    widths = [max(len(_printable(row[i])) for row in rows) for i in range(len(headers))]
    lines = ["  ".join(_printable(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _holder(info: LockInfo) -> str:
    if info.owner is None:
        return "-"
    others = len(info.holders) - 1
    return info.owner if others <= 0 else f"{info.owner} (+{others} more)"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def snapshot(
    url: str, names: Sequence[str], *, prefix: str | None, json_output: bool, kind: str = "lock", timeout: float = 5.0
) -> str:
    infos = asyncio.run(collect(url, names, prefix=prefix, kind=kind, timeout=timeout))
    return as_json(infos) if json_output else as_table(infos)
