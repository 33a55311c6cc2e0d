"""The fenced store: a counter that refuses operations carrying a stale token.

It lives on a redis-server of its own (never the lock server, so that faults
injected into the lock service cannot touch it). Every read and every write
carries the fencing token of the section doing it; the store remembers the
highest token it has seen and refuses any operation whose token is lower.
Because reads are fenced too, a holder that read the counter, was paused,
and writes after a newer holder has read it is refused, so a lost update can
only show up if two holders were given the same or a backwards token, or if
the lock let two sections read and write in turn unfenced.

Tokens are compared as decimal strings (length first), so tokens beyond
2**53 stay exact in Lua.

Beside the counter, a log written through asynclock's own fence
(:class:`asynclock.fencing.RedisFence`): each section appends its token to it,
so the order in which the store applied those writes can be checked (a token
older than one applied before it is a stale holder's write let through).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

import asynclock
from asynclock.fencing import RedisFence, StaleToken

# KEYS[1] counter, KEYS[2] highest token seen, KEYS[3] accepted writes,
# KEYS[4] refused operations, KEYS[5] log of accepted operations
# ARGV[1] token (decimal), ARGV[2] "read" or "write", ARGV[3] new value (write), ARGV[4] who
# returns {1, counter} when accepted, {0, highest token} when refused
FENCED_OP = """
local token = ARGV[1]
local high = redis.call('GET', KEYS[2])
if high and (#token < #high or (#token == #high and token < high)) then
  redis.call('INCR', KEYS[4])
  return {0, high}
end
redis.call('SET', KEYS[2], token)
if ARGV[2] == 'write' then
  redis.call('SET', KEYS[1], ARGV[3])
  redis.call('INCR', KEYS[3])
end
redis.call('RPUSH', KEYS[5], ARGV[2] .. ' ' .. token .. ' ' .. ARGV[4])
return {1, tonumber(redis.call('GET', KEYS[1]) or '0')}
"""


@dataclass(frozen=True, slots=True)
class StoreState:
    """What the store holds at the end of a run."""

    counter: int
    accepted_writes: int
    refused: int
    #: accepted operations in the order the store applied them: (kind, token, who)
    log: tuple[tuple[str, int, str], ...]
    #: the writes asynclock's fence let through, in the order the store applied them: (token, who)
    fenced: tuple[tuple[int, str], ...] = ()


class FencedStore:
    """A fenced counter under ``prefix`` on the redis-server at ``url``."""

    def __init__(self, url: str, prefix: str) -> None:
        self._client = aioredis.Redis.from_url(url)
        self._op = self._client.register_script(FENCED_OP)
        self._keys = [f"{prefix}:{part}" for part in ("counter", "high", "accepted", "refused", "log")]
        self._fence = RedisFence(self._client, prefix=f"{prefix}:fence")
        self._fenced_log = f"{prefix}:fenced"

    async def read(self, token: int, who: str) -> int | None:
        """The counter, or None if ``token`` is stale."""
        ok, value = await self._op(keys=self._keys, args=[str(token), "read", "", who])
        return int(value) if ok == 1 else None

    async def write(self, token: int, value: int, who: str) -> bool:
        """Set the counter to ``value``; False (nothing changed) if ``token`` is stale."""
        ok, _ = await self._op(keys=self._keys, args=[str(token), "write", str(value), who])
        return bool(ok == 1)

    async def fenced(self, held: asynclock.Lease | asynclock.Term | int, who: str, resource: str) -> str:
        """Append ``held``'s token to the fenced log through the fence: "ok", "refused" (by the
        store: a newer token wrote first) or "lost" (the lease known lost: refused before any I/O)."""
        token = held if isinstance(held, int) else held.token
        try:
            await self._fence.call(held, "RPUSH", self._fenced_log, f"{token} {who}", resource=resource)
        except StaleToken as stale:
            return "lost" if stale.mark is None else "refused"
        return "ok"

    async def state(self) -> StoreState:
        counter, accepted, refused = await self._client.mget(self._keys[0], self._keys[2], self._keys[3])
        raw = await self._client.lrange(self._keys[4], 0, -1)
        log = []
        for entry in raw:
            text = entry.decode() if isinstance(entry, bytes) else str(entry)
            kind, token, who = text.split(" ", 2)
            log.append((kind, int(token), who))
        fenced = []
        for entry in await self._client.lrange(self._fenced_log, 0, -1):
            token, who = entry.decode().split(" ", 1)
            fenced.append((int(token), who))
        return StoreState(int(counter or 0), int(accepted or 0), int(refused or 0), tuple(log), tuple(fenced))

    async def clear(self) -> None:
        marks = [key async for key in self._client.scan_iter(match=self._fence.mark_key("*"))]
        await self._client.delete(*self._keys, self._fenced_log, *marks)

    async def aclose(self) -> None:
        await self._client.aclose()
