"""The adapter-per-primitive backend protocol, served through the request protocol.

Backends not yet moved to ``asynclock.abc.Backend`` serve each primitive by
an adapter object (``primitive(shape)``) with name-based requests, and queue
their waiters in one ``wait_acquire`` call. :class:`LegacyAdapter` makes such
a backend answer the request protocol: a queued wait runs in a task of its
own, as those backends expect, and its outcome is given back if the caller
stops waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ._errors import BackendUnavailable, LockError
from ._timing import REQUEST_WINDOW, request_window
from ._values import LockInfo
from .abc import Acquired, BackendHooks, Busy, Kind, LockRef, Queued, RenewItem

ShapeKind = Literal["lock", "fair", "read", "write", "semaphore"]


@dataclass(frozen=True, slots=True)
class Shape:
    """Which primitive an adapter serves: its kind, and for a semaphore how many may hold it."""

    kind: ShapeKind = "lock"
    permits: int = 1


#: The plain lock: served by the backend object itself (or the adapter it names).
LOCK = Shape()


class LegacyBackend(Protocol):
    """A backend or adapter of the adapter-per-primitive protocol."""

    kind: str
    queues_waiters: bool

    async def start(self, hooks: BackendHooks) -> None: ...

    def lock_key(self, name: str) -> str: ...

    def lease_time(self, ttl: float) -> float: ...

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy: ...

    async def wait_acquire(self, name: str, hold: str, ttl: float, timeout: float | None) -> Acquired | None: ...

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool: ...

    async def release(self, name: str, hold: str) -> bool: ...

    async def renew(self, items: Sequence[RenewItem]) -> Sequence[bool | BaseException]: ...

    async def subscribe(self, name: str) -> None: ...

    async def unsubscribe(self, name: str) -> None: ...

    async def info(self, name: str) -> LockInfo: ...

    async def aclose(self) -> None: ...

    def primitive(self, shape: Shape) -> LegacyBackend: ...


class WaitEnded(BackendUnavailable):
    """A queued wait that failed after the backend's own retries: not to be retried again."""

    retryable = False


def legacy_unsupported(kind: str, shape: Shape, hint: str = "") -> NotImplementedError:
    from .abc import unsupported

    return unsupported(kind, shape.kind, hint)


def shape_of(ref: LockRef) -> Shape:
    if ref.kind == "lock":
        return LOCK
    if ref.kind == "election":  # (the front asks only backends that implement abc.Elects)
        raise NotImplementedError("leader election needs a backend that implements asynclock.abc.Elects")
    return Shape(ref.kind, ref.permits if ref.kind == "semaphore" else 1)


class LegacyAdapter:
    """A backend of the adapter-per-primitive protocol, answering the request protocol."""

    def __init__(self, root: LegacyBackend) -> None:
        self.legacy = root
        self.kind = root.kind
        self._adapters: dict[Shape, LegacyBackend] = {LOCK: root.primitive(LOCK)}
        self._starting: dict[int, asyncio.Task[None]] = {}
        self._hooks: BackendHooks | None = None
        self._finishing: set[asyncio.Task[Any]] = set()
        self._inner: set[asyncio.Task[Any]] = set()

    def _adapter(self, ref: LockRef) -> LegacyBackend:
        shape = shape_of(ref)
        adapter = self._adapters.get(shape)
        if adapter is None:
            adapter = self._adapters[shape] = self.legacy.primitive(shape)
        return adapter

    async def _ready(self, ref: LockRef) -> LegacyBackend:
        adapter = self._adapter(ref)
        if adapter is self.legacy or ref.kind == "lock":
            return adapter
        starting = self._starting.get(id(adapter))
        if starting is None:
            assert self._hooks is not None
            starting = self._starting[id(adapter)] = asyncio.get_running_loop().create_task(adapter.start(self._hooks))
        await asyncio.shield(starting)
        return adapter

    # -- the request protocol ------------------------------------------------------

    def check_kind(self, kind: Kind) -> None:
        self._adapter(LockRef(kind, ""))

    def lock_key(self, ref: LockRef) -> str:
        return self._adapter(ref).lock_key(ref.name)

    def lease_time(self, ttl: float) -> float:
        return self.legacy.lease_time(ttl)

    async def start(self, hooks: BackendHooks) -> None:
        self._hooks = hooks
        await self.legacy.start(hooks)

    async def try_acquire(self, ref: LockRef, hold: str, ttl: float, *, enqueue: bool) -> Acquired | Busy | Queued:
        adapter = await self._ready(ref)
        if not adapter.queues_waiters:
            return await adapter.try_acquire(ref.name, hold, ttl)
        # The adapter makes its one try (``timeout=0``) in ``wait_acquire`` too,
        # bounded by its own rules: ``wait_queued`` runs it.
        return Queued(None)

    async def wait_queued(self, ref: LockRef, hold: str, ttl: float, until: float | None) -> Acquired | Queued:
        adapter = await self._ready(ref)
        loop = asyncio.get_running_loop()
        timeout = None if until is None else max(0.0, until - loop.time())
        task = loop.create_task(adapter.wait_acquire(ref.name, hold, ttl, timeout))
        self._inner.add(task)
        task.add_done_callback(self._inner.discard)
        # The backend bounds its own wait; this outer bound only guards against one that does not.
        window = request_window(self.lease_time(ttl))
        outer = None if timeout is None else loop.time() + timeout + window + 1.0
        try:
            async with asyncio.timeout_at(outer):
                result = await asyncio.shield(task)
        except asyncio.CancelledError:
            finisher = self._give_back_later(task, adapter, ref, hold, ttl)
            # Let the wait leave the queue before the cancellation goes on (bounded).
            give_up = loop.time() + window
            while not finisher.done() and (left := give_up - loop.time()) > 0:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({finisher}, timeout=left)
            raise
        except TimeoutError as exc:
            if not task.done():  # the outer bound fired
                self._give_back_later(task, adapter, ref, hold, ttl)
            raise WaitEnded(f"the queued wait did not end in time: {exc!r}") from exc
        except (LockError, OSError) as exc:
            if isinstance(exc, (BackendUnavailable, OSError)):
                raise WaitEnded(str(exc) or repr(exc)) from exc
            raise
        return Queued(None) if result is None else result

    def _give_back_later(
        self, task: asyncio.Task[Any], adapter: LegacyBackend, ref: LockRef, hold: str, ttl: float
    ) -> asyncio.Task[None]:
        """Stop the wait; should it have got the lock anyway, release it."""
        task.cancel()

        async def finish() -> None:
            try:
                async with asyncio.timeout(2 * ttl + REQUEST_WINDOW):
                    result = await task
            except (LockError, OSError, TimeoutError, asyncio.CancelledError):  # unknown: release by identity
                result = Acquired(None)
            if isinstance(result, Acquired):
                with contextlib.suppress(LockError, OSError, TimeoutError):
                    async with asyncio.timeout(ttl + REQUEST_WINDOW):
                        await adapter.release(ref.name, hold)

        finisher = asyncio.get_running_loop().create_task(finish())
        self._finishing.add(finisher)
        finisher.add_done_callback(self._finishing.discard)
        return finisher

    async def set_count(self, ref: LockRef, hold: str, count: int, ttl: float) -> bool:
        return await self._adapter(ref).set_count(ref.name, hold, count, ttl)

    async def release(self, ref: LockRef, hold: str) -> bool:
        adapter = await self._ready(ref)
        return await adapter.release(ref.name, hold)

    async def renew(self, items: Sequence[RenewItem]) -> Sequence[bool | BaseException]:
        groups: dict[int, tuple[LegacyBackend, list[int]]] = {}
        for index, item in enumerate(items):
            adapter = self._adapter(item.ref)
            groups.setdefault(id(adapter), (adapter, []))[1].append(index)
        results: list[bool | BaseException] = [False] * len(items)

        async def one(adapter: LegacyBackend, indexes: list[int]) -> None:
            try:
                answers = list(await adapter.renew([items[i] for i in indexes]))
            except (LockError, OSError, TimeoutError) as exc:
                answers = [exc] * len(indexes)
            for index, answer in zip(indexes, answers, strict=True):
                results[index] = answer

        await asyncio.gather(*(one(adapter, indexes) for adapter, indexes in groups.values()))
        return results

    async def info(self, ref: LockRef) -> LockInfo:
        adapter = await self._ready(ref)
        return await adapter.info(ref.name)

    async def subscribe(self, name: str) -> None:
        await self._adapters[LOCK].subscribe(name)

    async def unsubscribe(self, name: str) -> None:
        await self._adapters[LOCK].unsubscribe(name)

    async def aclose(self) -> None:
        for task in list(self._inner):
            task.cancel()
        if self._inner or self._finishing:
            await asyncio.wait([*self._inner, *self._finishing], timeout=2 * REQUEST_WINDOW)
        for task in list(self._finishing):
            task.cancel()
        # Each started adapter once (the plain lock's may be the fair lock's too), the backend last.
        closed: set[int] = {id(self.legacy)}
        started = [adapter for adapter in self._adapters.values() if id(adapter) in self._starting]
        for adapter in [*started, self._adapters[LOCK]]:
            if id(adapter) not in closed:
                closed.add(id(adapter))
                with contextlib.suppress(LockError, OSError):
                    await adapter.aclose()
        await self.legacy.aclose()
