"""The hash lock: the plain lock of Redis Cluster and of each Redlock node.

One hash per lock, ``<prefix>:{<name>}``, with fields ``owner`` (the hold id,
unique per acquisition), ``count`` (hold count) and ``token`` (fencing
token), expiring by PEXPIRE. Beside it ``<prefix>:{<name>}:fence`` remembers
the last token. A release is announced on ``<prefix>:{<name>}:released`` to
every subscriber (``SPUBLISH`` on a Cluster, where a script cannot publish to
a channel in another slot): waiters try again when they hear it (no queue,
no fairness). All keys share the ``{<name>}`` hash tag, so each script
touches one slot. The scripts are ``_scripts/hash_*.lua``.

Fencing tokens are ``max(last token + 1, server time in microseconds)``. The
stored counter makes them strictly increasing while Redis keeps its data; the
time floor keeps them increasing after Redis restarts with no data (or the
counter key is evicted), because a new token is never smaller than the
server's clock and every earlier token was at most a few microseconds ahead of
the clock when it was issued. It assumes the server's clock does not step
backwards by more than the counter's lifetime.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._values import LockInfo
from ...abc import Acquired, Busy, RenewItem
from ._connection import FENCE_LIFETIME_MS, Connection, Script, ms, text
from ._renew import renew_in_chunks

__all__ = ["HashLock"]

ACQUIRE = Script.load("hash_acquire.lua")
SET_COUNT = Script.load("hash_set_count.lua")
RELEASE = Script.load("hash_release.lua")
#: Redis Cluster: the release announced on the lock's shard channel (Redis >= 7).
RELEASE_SHARDED = Script.load("hash_release.lua", replace=("'PUBLISH'", "'SPUBLISH'"))
RENEW = Script.load("hash_renew.lua")
INFO = Script.load("hash_info.lua")


class HashLock:
    """Plain locks as hashes on one server (or one Cluster), released with a broadcast."""

    def __init__(self, connection: Connection, prefix: str, *, sharded: bool = False) -> None:
        self.connection = connection
        self._prefix = prefix
        self._release = RELEASE_SHARDED if sharded else RELEASE

    def key(self, name: str) -> str:
        """The lock's hash."""
        return f"{self._prefix}:{{{name}}}"

    def channel(self, name: str) -> str:
        """Where releases of ``name`` are announced to every subscriber."""
        return f"{self._prefix}:{{{name}}}:released"

    async def try_acquire(self, name: str, hold: str, ttl: float) -> Acquired | Busy:
        keys = (self.key(name), f"{self._prefix}:{{{name}}}:fence")
        got, value = await self.connection.run(ACQUIRE, keys, (hold, ms(ttl), FENCE_LIFETIME_MS))
        if got == 1:
            return Acquired(int(value))
        pttl = int(value)
        return Busy(pttl / 1000 if pttl >= 0 else 0.0)

    async def set_count(self, name: str, hold: str, count: int, ttl: float) -> bool:
        return bool(await self.connection.run(SET_COUNT, (self.key(name),), (hold, count, ms(ttl))))

    async def release(self, name: str, hold: str) -> bool:
        return bool(await self.connection.run(self._release, (self.key(name), self.channel(name)), (hold,)))

    async def renew(self, items: Sequence[RenewItem]) -> list[bool | BaseException]:
        """Renew ``items`` in script calls of ``RENEW_CHUNK`` holds (``_renew.py``)."""
        return await renew_in_chunks(self.connection, RENEW, items, self._renewal)

    def _renewal(self, chunk: Sequence[RenewItem]) -> tuple[list[str], list[str | int]]:
        args: list[str | int] = []
        for item in chunk:
            args += [item.hold, ms(item.ttl)]
        return [self.key(item.name) for item in chunk], args

    async def info(self, name: str) -> LockInfo:
        owner, count, token, pttl = await self.connection.run(INFO, (self.key(name),), ())
        holder = text(owner)
        return LockInfo(
            name=name,
            key=self.key(name),
            owner=holder,
            hold_count=int(count) if holder is not None and count is not None else 0,
            ttl=int(pttl) / 1000 if holder is not None and int(pttl) >= 0 else None,
            waiters=None,
            token=int(token) if holder is not None and token is not None else None,
        )

    async def names(self) -> list[str]:
        """Names of the locks held under the prefix (their hashes ``<prefix>:{<name>}``)."""
        start = len(self._prefix) + 2
        return [key[start:-1] for key in await self.connection.scan(f"{self._prefix}:{{*}}") if key.endswith("}")]
