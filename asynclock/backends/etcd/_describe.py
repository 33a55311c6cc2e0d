"""What etcd says about a lock (``info``) and which locks have contenders (``names``): reads only."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable

from ..._errors import LockError
from ..._values import LockInfo
from ...abc import LockRef
from ._client import EtcdClient
from ._node import Node
from ._recipe import RESERVED, Layout, permits_of, rw_holders, unescape_name
from ._replies import KeyValue
from ._session import Session
from ._wire import ASCEND, SORT_CREATE, prefix_end, range_request

__all__ = ["check_permits", "describe", "lock_names"]


async def check_permits(client: EtcdClient, name: str, leases: bytes, permits: int, timeout: float) -> None:
    """ValueError if the semaphore's lease keys under ``leases`` were put with another number
    of permits: the first one speaks for them all (each was checked under the mutex)."""
    request = range_request(leases, prefix_end(leases), limit=1, sort_order=ASCEND, sort_target=SORT_CREATE)
    first = (await client.range(request, timeout)).kvs
    theirs = permits_of(first[0].value) if first else None
    if theirs is not None and theirs != permits:
        raise ValueError(
            f"semaphore {name!r} is held or awaited with permits={theirs} by other clients;"
            f" this one asks for permits={permits}: every client of a semaphore must use the same number"
        )


async def describe(
    client: EtcdClient, session: Session, nodes: Iterable[Node], ref: LockRef, key: str, *, local: int = 0
) -> LockInfo:
    """What etcd says of the primitive ``ref`` whose lock key is ``key``: who holds it (a
    read-write lock: the readers ahead of the first writer, or that writer; a semaphore:
    the first ``permits`` leases) and how many wait (a semaphore's: at its mutex; a
    Mutex's and an Election's: ``local`` tasks of this client too). ``nodes``: this
    client's, whose holders are shown by hold id (others by key)."""
    if ref.kind in ("lock", "fair", "election"):
        return await _describe(
            client, session, nodes, ref.name, key, f"{key}/".encode(), lambda kvs: kvs[:1], local=local
        )
    if ref.kind in ("read", "write"):
        pick = functools.partial(rw_holders, rw_key=key)
        return await _describe(client, session, nodes, ref.name, key, f"{key}/".encode(), pick)
    permits = ref.permits
    leases, waiting = f"{key}/leases/".encode(), f"{key}/locks/".encode()
    return await _describe(client, session, nodes, ref.name, key, leases, lambda kvs: kvs[:permits], queue=waiting)


async def _describe(
    client: EtcdClient,
    session: Session,
    nodes: Iterable[Node],
    name: str,
    key: str,
    directory: bytes,
    pick: Callable[[list[KeyValue]], list[KeyValue]],
    *,
    local: int = 0,
    queue: bytes | None = None,
) -> LockInfo:
    """The contenders under ``directory`` in create order, of which ``pick`` holds;
    waiters are the others (or the contenders under ``queue``), and ``local`` tasks
    of this client waiting for their turn. ``nodes``: this client's, whose holders
    are shown by hold id (others by key)."""
    timeout = session.window()
    contenders = (await client.range(_range_all(directory, sort=True), timeout)).kvs
    holders = pick(contenders)
    if queue is None:
        waiters = len(contenders) - len(holders)
    else:
        waiters = len((await client.range(_range_all(queue), timeout)).kvs)
    waiters += local
    if not holders:
        return LockInfo(name=name, key=key, owner=None, hold_count=0, ttl=None, waiters=waiters, token=None)
    ours = {node.contender.key: node for node in nodes if node.held and node.contender is not None}
    ids = tuple(ours[kv.key].hold if kv.key in ours else kv.key.decode(errors="replace") for kv in holders)
    first = holders[0]
    mine = ours.get(first.key)
    ttl: float | None = None
    if mine is not None and mine.lease is not None:
        left = mine.lease.confirmed_at + session.lease_time(mine.ttl) - asyncio.get_running_loop().time()
        ttl = max(0.0, left)
    elif first.lease:
        with contextlib.suppress(LockError):
            # whole seconds left, rounded down; -1 once expired
            alive = await client.time_to_live(first.lease, timeout)
            ttl = float(alive.ttl) if alive.ttl >= 0 else None
    return LockInfo(
        name=name,
        key=key,
        owner=ids[0],
        hold_count=mine.count if mine is not None else 1,
        ttl=ttl,
        waiters=waiters,
        token=first.create_revision,
        holders=ids,
    )


async def lock_names(client: EtcdClient, layout: Layout, timeout: float) -> list[str]:
    """Plain lock names under ``layout`` that have contenders now."""
    root = layout.root
    answer = await client.range(_range_all(root), timeout)
    found = set()
    for kv in answer.kvs:
        segment = kv.key[len(root) :].split(b"/", 1)[0].decode(errors="replace")
        if segment and segment not in RESERVED:
            with contextlib.suppress(UnicodeDecodeError):
                found.add(unescape_name(segment))
    return sorted(found)


def _range_all(directory: bytes, *, sort: bool = False) -> bytes:
    """A Range request for the keys (no values) under ``directory``, in create order with ``sort``."""
    return range_request(
        directory,
        prefix_end(directory),
        keys_only=True,
        sort_order=ASCEND if sort else 0,
        sort_target=SORT_CREATE if sort else 0,
    )
