"""Who leads an election, on Curator's LeaderLatch layout.

A candidate is an ephemeral sequential node ``_c_<guid>-latch-<seq>`` under
the election's znode, holding the candidate's identity in UTF-8 (Curator's
participant id); the lowest contender leads (the lock recipe of
:mod:`._recipe`, FIFO). So the leader is one read away: the first contender's
data is its identity, its czxid the term's fencing token (a later leader's
node was created later: a larger zxid). ZooKeeper keeps no record of when a
node became the lowest, so a leader's ``since`` is None.

Nothing here writes: an observer only reads and sets watches. While somebody
leads, a watch on the leader's node (its deletion is the only way the leader
changes: a new node is never ahead of an existing one); while nobody does,
a children watch on the election's znode, or, if that does not exist, a
watch on its creation. A node's data is never changed (a Curator candidate
waiting behind it watches it with getData and would miss its deletion after
a data change).
"""

from __future__ import annotations

from ..._values import Leader
from .._edge import MapErrors
from .._reread import RereadWatch
from ._order import contenders_of
from ._session import WatchCallback, ZkSession
from ._wire import NO_NODE, ZkError, children_request, exists_request, get_data_request

__all__ = ["ZkLeaderWatch", "read_leader"]


async def read_leader(
    session: ZkSession, path: str, watch: WatchCallback | None = None, armed: set[tuple[str, str]] | None = None
) -> tuple[Leader | None, bool]:
    """The leader of the election at ``path``, and whether to read again (a watch raced the read).

    With ``watch``, arms the one watch that fires on the next change (see
    the module's docstring) and adds it to ``armed`` as (kind, path), for the
    caller to forget with ``session.unwatch``.
    """
    armed = set() if armed is None else armed
    while True:
        try:
            reply = await session.call(children_request(path), path)
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            if watch is None:
                return None, False
            armed.add(("data", path))  # (set by an exists even when it answers NoNode)
            try:
                await session.call(exists_request(path, watch=True), path, watch=("data", watch))
            except ZkError as missing:
                if missing.code != NO_NODE:
                    raise
                return None, False  # watching for its creation
            return None, True  # created meanwhile
        contenders = contenders_of(reply.children)
        if not contenders:
            if watch is None:
                return None, False
            try:
                again = await session.call(children_request(path, watch=True), path, watch=("child", watch))
            except ZkError as exc:
                if exc.code != NO_NODE:
                    raise
                continue  # deleted meanwhile (an empty container goes): watch for its creation
            armed.add(("child", path))
            return None, bool(contenders_of(again.children))
        first = f"{path}/{contenders[0]}"
        try:
            data = await session.call(
                get_data_request(first, watch=watch is not None),
                first,
                watch=None if watch is None else ("data", watch),
            )
        except ZkError as exc:
            if exc.code != NO_NODE:
                raise
            continue  # the leader went meanwhile: look again
        if watch is not None:
            armed.add(("data", first))
        identity = bytes(data.data or b"").decode("utf-8", errors="replace")
        return Leader(identity, int(data.stat.created_zxid), None), False


class ZkLeaderWatch(RereadWatch):
    """The leader of one election after each change (``Elects.observe``): a read after every watch event.

    Watches are one-shot and say only that something changed, so changes
    that come and go between two reads are seen as one. A lost connection
    fires the watches too: the next read waits for the connection for at
    most ``window`` seconds, then raises for the caller to retry. Errors
    are asynclock's: ``edge`` is the backend's (:func:`._wire.edge`).
    """

    def __init__(self, session: ZkSession, path: str, window: float, edge: MapErrors) -> None:
        super().__init__()
        self._edge = edge
        self._session = session
        self._path = path
        self._window = window
        self._armed: set[tuple[str, str]] = set()

    def _fired(self, what: str) -> None:
        self.wake()

    async def _join(self) -> None:
        """Nothing to join: each read arms the watches it needs."""

    def _leave(self) -> None:
        self._unarm()

    async def _read(self) -> tuple[Leader | None, float | None]:
        self._unarm()  # (what was armed may have gone with the connection: armed again by this read)
        with self._edge:
            await self._session.wait_connected(self._window)
            leader, again = await read_leader(self._session, self._path, self._fired, self._armed)
        return leader, (0.0 if again else None)

    def _unarm(self) -> None:
        session = self._session
        for kind, path in self._armed:
            session.unwatch(kind, path, self._fired)
        self._armed.clear()
