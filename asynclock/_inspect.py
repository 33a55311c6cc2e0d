"""``asynclock inspect URL [NAME ...]``: what the server says about locks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from ._connect import connect
from ._values import LockInfo


async def collect(url: str, names: Sequence[str], *, prefix: str | None = None) -> list[LockInfo]:
    """LockInfo for each name, or for every lock the backend can list under the prefix."""
    async with connect(url, prefix=prefix) as locks:
        wanted = list(names)
        if not wanted:
            lister = getattr(locks.backend, "names", None)
            if lister is None:
                raise ValueError(f"the {locks.backend.kind} backend cannot list its locks: name them")
            wanted = sorted(await lister())
        return [await locks.lock(name).info() for name in wanted]


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
                info.owner or "-",
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


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def snapshot(url: str, names: Sequence[str], *, prefix: str | None, json_output: bool) -> str:
    import asyncio

    infos = asyncio.run(collect(url, names, prefix=prefix))
    return as_json(infos) if json_output else as_table(infos)
