"""What the server says about locks: who holds one and who waits (``info``), which are held (``names``),
and how many permits a semaphore's other clients asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import unquote

from ..._values import LockInfo
from ...abc import LockRef
from ._holds import Holds
from ._layout import RESERVED, SEM_LEASES, SEM_LOCKS, permits_of
from ._order import contenders_of, rw_holders
from ._session import ZkSession
from ._wire import NO_NODE, ZkError, children_request, exists_request, get_data_request

__all__ = ["check_permits", "children", "describe", "lock_names"]


async def check_permits(session: ZkSession, name: str, leases: str, others: list[str], permits: int) -> None:
    """ValueError if the semaphore's other leases were taken with another number of permits.

    Runs while this client holds the semaphore's mutex, so every lease
    was checked against those before it when it was made: the first one
    that says how many permits its client asked for speaks for them all.
    Leases that say nothing (Curator's) are skipped.
    """
    for child in others:
        path = f"{leases}/{child}"
        try:
            reply = await session.call(get_data_request(path), path)
        except ZkError as exc:
            if exc.code == NO_NODE:
                continue  # released meanwhile
            raise
        theirs = permits_of(reply.data)
        if theirs is None:
            continue
        if theirs != permits:
            raise ValueError(
                f"semaphore {name!r} is held or awaited with permits={theirs} by other clients;"
                f" this one asks for permits={permits}: every client of a semaphore must use the same number"
            )
        return


async def children(session: ZkSession, path: str) -> list[str]:
    """The contenders among the children of ``path``, in order ([] if it does not exist)."""
    try:
        reply = await session.call(children_request(path), path)
    except ZkError as exc:
        if exc.code != NO_NODE:
            raise
        return []
    return contenders_of(reply.children)


async def describe(session: ZkSession, holds: Holds, ref: LockRef, key: str) -> LockInfo:
    """What the server says of the primitive ``ref`` at the znode ``key``: who holds it (a
    read-write lock: the readers ahead of the first writer, or that writer; a semaphore:
    the first ``permits`` leases) and how many wait (a semaphore's: at its mutex)."""
    if ref.kind in ("lock", "fair", "election"):
        return await _describe(session, holds, ref.name, key)
    if ref.kind in ("read", "write"):
        return await _describe(session, holds, ref.name, key, pick=rw_holders)
    permits = ref.permits
    return await _describe(
        session,
        holds,
        ref.name,
        key,
        nodes=f"{key}/{SEM_LEASES}",
        pick=lambda contenders: contenders[:permits],
        queue=f"{key}/{SEM_LOCKS}",
    )


async def _describe(
    session: ZkSession,
    holds: Holds,
    name: str,
    key: str,
    *,
    nodes: str | None = None,
    pick: Callable[[list[str]], list[str]] = lambda contenders: contenders[:1],
    queue: str | None = None,
) -> LockInfo:
    """What the server says: the contenders under ``nodes`` (default ``key``), of
    which ``pick`` holds; the waiters are the other contenders, or those under ``queue``."""
    nodes = nodes or key
    contenders = await children(session, nodes)
    while True:
        holders = pick(contenders)
        if not holders:
            break
        first = f"{nodes}/{holders[0]}"
        try:
            stat = await session.call(exists_request(first), first)
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            contenders.remove(holders[0])  # released meanwhile: look again
            continue
        break
    waiters = len(contenders) - len(holders) if queue is None else len(await children(session, queue))
    if not holders:
        return LockInfo(name=name, key=key, owner=None, hold_count=0, ttl=None, waiters=waiters, token=None)
    ours = holds.held_paths()
    ids = tuple(ours[f"{nodes}/{h}"].hold if f"{nodes}/{h}" in ours else h for h in holders)
    mine = ours.get(first)
    return LockInfo(
        name=name,
        key=key,
        owner=ids[0],
        hold_count=mine.count if mine is not None else 1,
        ttl=session.timeout if mine is not None else None,
        waiters=waiters,
        token=int(stat.stat.created_zxid),
        holders=ids,
    )


async def lock_names(session: ZkSession, base: str) -> list[str]:
    """Lock names under ``base`` (the client's prefix) that have contenders now: held or waited for.

    A lock's znode is a container, which the server deletes some time after
    its last contender's node went (a minute, by default): until then it is
    there with nobody under it, so each one's contenders are read (all at
    once, pipelined on the session).
    """
    try:
        reply = await session.call(children_request(base), base)
    except ZkError as exc:
        if exc.code == NO_NODE:
            return []
        raise
    locks = [child for child in reply.children if child not in RESERVED]
    contenders = await asyncio.gather(*(children(session, f"{base}/{child}") for child in locks))
    return sorted(unquote(child, errors="strict") for child, found in zip(locks, contenders, strict=True) if found)
