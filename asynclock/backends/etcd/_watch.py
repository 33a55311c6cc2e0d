"""Watches of an etcd client: every watch of the client on one ``Watch`` stream.

A watch looks for the deletion of one key (or of any key of a range) from a
given revision on, and fires once: with ``"deleted"`` when etcd reports a
delete event, or with ``"lost"`` when it can no longer tell (the stream broke
or was closed, etcd cancelled the watch, or its revision was compacted).
A waiter whose watch is lost reads again, as after any reconnect, so nothing
depends on a watch surviving a failover. The stream asks for a member that
has a leader: a member cut off from the others refuses it instead of
keeping a watch open and silent.

A watch made with ``events=True`` (an election's observer) keeps every put
and delete etcd reports, in order, in ``events``, and fires only when it is
lost; one whose reader falls :data:`MAX_EVENTS` behind is lost too (the
reader reads again), so a watch nobody reads any more cannot grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

import grpc.aio

from ..._timing import REQUEST_WINDOW
from .._background import Background
from ._channel import Endpoint
from ._errors import said
from ._replies import DELETE, Event, WatchResult
from ._wire import NOPUT, watch_cancel_request, watch_create_request

__all__ = ["Client", "Watch", "Watches"]

logger = logging.getLogger("asynclock")

_WATCH = "/etcdserverpb.Watch/Watch"
#: Events an ``events=True`` watch keeps for its reader before it gives up on it.
MAX_EVENTS = 1024


class Watch:
    """One watch of a key (or a range): ``fired`` is set once, with ``reason``
    ``"deleted"``, ``"lost"`` or ``"cancelled"``. ``confirmed`` is set when etcd
    confirmed it (``revision``: it reports what happens after that revision)
    or when it fired. With ``events`` (a deque), it keeps every event etcd
    reports there and sets ``changed`` for each batch, and for its firing."""

    __slots__ = (
        "changed",
        "confirmed",
        "events",
        "fired",
        "key",
        "range_end",
        "reason",
        "revision",
        "start_revision",
        "watch_id",
    )

    def __init__(self, key: bytes, range_end: bytes, start_revision: int, *, events: bool = False) -> None:
        self.key = key
        self.range_end = range_end
        self.start_revision = start_revision
        self.watch_id: int | None = None
        self.revision = 0
        self.confirmed = asyncio.Event()
        self.fired = asyncio.Event()
        self.reason = ""
        self.events: deque[Event] | None = deque() if events else None
        self.changed = asyncio.Event()

    def fire(self, reason: str) -> None:
        if not self.fired.is_set():
            self.reason = reason
            self.fired.set()
            self.confirmed.set()
            self.changed.set()


class Client(Protocol):
    """What the watch stream needs of its client."""

    #: requests sent (a watch's creation counts as one)
    requests: int

    @property
    def endpoint(self) -> Endpoint:
        """The member requests go to now."""
        ...

    @property
    def stream_metadata(self) -> tuple[tuple[str, str], ...]:
        """What a stream is opened with."""
        ...


class Watches:
    """The watch stream of one client and the watches on it."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._watches: dict[int, Watch] = {}
        # asked for, not yet confirmed by etcd: it confirms in the order asked
        self._creating: deque[Watch] = deque()
        #: requests to etcd to drop a watch, sent in the background
        self._cancels = Background()

    async def watch(
        self, key: bytes, start_revision: int, timeout: float, range_end: bytes = b"", *, events: bool = False
    ) -> Watch:
        """Watch ``key`` (or the range up to ``range_end``) for deletions from
        ``start_revision`` on (0: from now), or with ``events`` for every put and
        delete; returns once the request is written (etcd confirms it on the
        stream: ``Watch.confirmed``)."""
        client = self._client
        if self._lock is None:
            self._lock = asyncio.Lock()
        watch = Watch(key, range_end, start_revision, events=events)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with asyncio.timeout_at(deadline):
            await self._lock.acquire()
        try:
            endpoint = client.endpoint
            with endpoint.edge:
                try:
                    async with asyncio.timeout_at(deadline):
                        if self._call is None:
                            call = endpoint.stream(_WATCH)(metadata=client.stream_metadata)
                            self._call = call
                            self._reader = loop.create_task(self._read(call, endpoint), name="asynclock-etcd-watch")
                        self._creating.append(watch)
                        client.requests += 1
                        request = watch_create_request(
                            key, range_end, start_revision=start_revision, filters=() if events else (NOPUT,)
                        )
                        await self._call.write(request)
                except BaseException as exc:
                    self.fail(f"watch request failed: {said(exc)}")
                    raise
        finally:
            self._lock.release()
        return watch

    def unwatch(self, watch: Watch) -> None:
        """Stop a watch: it fires ``"cancelled"`` now, and etcd is asked to drop it in the
        background (a watch that etcd has not confirmed yet is dropped once it is)."""
        watch.fire("cancelled")
        if watch.watch_id is None or self._watches.get(watch.watch_id) is not watch:
            return
        del self._watches[watch.watch_id]
        self._cancel_later(watch.watch_id)

    async def _read(self, call: Any, endpoint: Endpoint) -> None:
        reason = "the watch stream ended"
        try:
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    break
                self._on_answer(WatchResult.parse(answer))
        except asyncio.CancelledError:
            reason = "the watch stream was closed"
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the stream ends every watch on it
            reason = f"the watch stream failed: {said(exc)}"
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code().name != "CANCELLED":
                endpoint.translate(exc)  # a member in trouble: the next requests go to another
        finally:
            if self._call is call:
                self.fail(reason)

    def _on_answer(self, result: WatchResult) -> None:
        if result.created:
            watch = self._creating.popleft() if self._creating else None
            if watch is None:
                return
            if result.canceled:
                watch.fire("lost")
                return
            watch.watch_id = result.watch_id
            watch.revision = result.header.revision
            watch.confirmed.set()
            if watch.fired.is_set():
                # unwatched before etcd confirmed it: cancel it on the server
                self._cancel_later(result.watch_id)
                return
            self._watches[result.watch_id] = watch
        watch = self._watches.get(result.watch_id)
        if watch is None:
            return
        if result.canceled or result.compact_revision:
            del self._watches[result.watch_id]
            watch.fire("lost")
            return
        if watch.events is not None:
            if not result.events:
                return
            watch.events.extend(result.events)
            watch.changed.set()
            if len(watch.events) > MAX_EVENTS:
                watch.fire("lost")  # (its reader reads afresh)
                self.unwatch(watch)
            return
        if any(event.type == DELETE for event in result.events):
            del self._watches[result.watch_id]
            watch.fire("deleted")
            self._cancel_later(result.watch_id)

    def _cancel_later(self, watch_id: int) -> None:
        call = self._call
        if call is None:
            return

        async def cancel() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(REQUEST_WINDOW):  # best effort: a watch left on etcd costs it little
                    await call.write(watch_cancel_request(watch_id))

        self._cancels.spawn(cancel())

    def fail(self, reason: str) -> None:
        """Close the stream: every watch on it fires ``"lost"``."""
        call, self._call = self._call, None
        reader, self._reader = self._reader, None
        if call is not None:
            call.cancel()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        watches = [*self._watches.values(), *self._creating]
        self._watches.clear()
        self._creating.clear()
        if watches:
            logger.debug("etcd: %d watches lost: %s", len(watches), reason)
        for watch in watches:
            watch.fire("lost")

    async def close(self) -> None:
        reader = self._reader
        self._cancels.cancel()
        self.fail("the client was closed")
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
