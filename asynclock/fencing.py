"""Fences: writes that a holder whose lease was lost cannot make.

A lock's holder can be paused (a long GC pause, SIGSTOP, a VM migration)
past its lease and wake up still believing it holds the lock, after the
next holder took it and wrote. Its writes must then be refused by the store
itself. A fence keeps, for each resource, the highest fencing token that
wrote to it (its *mark*) and lets a write through only if the writer's
token is not older: the same holder writes as often as it likes, an older
holder is refused with :class:`StaleToken`.

* :class:`RedisFence` runs a Redis command in one script only if the token
  is fresh, and raises the mark to it;
* :class:`PostgresFence` raises the mark inside the caller's transaction,
  before the writes it guards: a stale token raises, and the caller's
  rollback undoes everything.

Both take a :class:`~asynclock.Lease` (or an election's
:class:`~asynclock.Term`), whose name is the default resource, or a bare
``int`` token with ``resource=``. A lease already known to be lost is
refused before any I/O. One resource's fence must be fed by one lock
backend: tokens of different backends do not compare.

Importing this module imports neither redis nor asyncpg: each fence uses
the client it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import StaleToken

if TYPE_CHECKING:
    import asyncpg
    from redis.asyncio import Redis, RedisCluster

    from ._election import Term
    from ._lease import Lease

__all__ = ["PostgresFence", "RedisFence", "StaleToken"]

StaleToken.__module__ = __name__

#: The largest token a PostgreSQL ``bigint`` holds.
BIGINT_MAX = 2**63 - 1

# KEYS[1] the resource's mark, then the command's keys (declared for Redis Cluster)
# ARGV[1] the writer's token (decimal digits), ARGV[2..] the command and its arguments
# returns {1, the command's reply} if the token is not older than the mark (which is
# then raised to it), else {0, the mark} having run nothing. Tokens are compared as
# decimal strings (length first), so that tokens past 2**53 stay exact in Lua. The
# command runs before the mark is raised: a command that fails raises nothing.
FENCED_CALL = """
if redis.replicate_commands then redis.replicate_commands() end
local token, mark = ARGV[1], redis.call('GET', KEYS[1])
if mark and (#token < #mark or (#token == #mark and token < mark)) then
  return {0, mark}
end
local reply = redis.call(unpack(ARGV, 2))
if token ~= mark then redis.call('SET', KEYS[1], token) end
return {1, reply}
"""


def _fenced(held: Lease | Term | int, resource: str | None) -> tuple[str, int]:
    """The resource and token of a write by ``held``; raises before any I/O what can be known here."""
    if isinstance(held, bool) or (not isinstance(held, int) and not hasattr(held, "token")):
        raise TypeError(f"expected a Lease, a Term or an int fencing token, got {type(held).__name__}")
    if isinstance(held, int):
        if resource is None:
            raise TypeError("a bare token needs resource=: the name of what it guards (a lease gives its own name)")
        token = held
    else:
        if held.token is None:
            raise ValueError(f"the lease of {held.name!r} has no fencing token: its backend gives none (Redlock)")
        token = held.token
        resource = held.name if resource is None else resource
    if not isinstance(resource, str) or not resource:
        raise ValueError(f"resource must be a non-empty str, got {resource!r}")
    if token < 0:
        raise ValueError(f"a fencing token is never negative, got {token}")
    if not isinstance(held, int) and held.lost:
        why = getattr(held, "lost_reason", None) or "lost"
        raise StaleToken(resource, token, reason=f"the lease was lost before the write ({why})")
    return resource, token


def _hash_tag(key: str) -> str:
    """What Redis Cluster hashes of ``key``: the text between its first ``{`` and the next ``}``, if any."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start != -1 and end > start + 1:
        return key[start + 1 : end]
    return key


class RedisFence:
    """A fence on a Redis store: a command runs only if the writer's token is fresh.

    ``client`` is the store's own ``redis.asyncio.Redis`` (one server, or
    a Sentinel's primary) or ``redis.asyncio.RedisCluster``; it may be the
    lock's Redis or any other. Each resource's mark is the string key
    ``<prefix>:{<resource>}:mark``, kept for good (one small key per resource).
    No I/O here::

        fence = RedisFence(store)
        async with locks.lock("orders:42") as lease:
            await fence.call(lease, "HSET", "{orders:42}:order", "state", "paid")

    On Redis Cluster the command's keys must be in the mark's slot: give
    them the resource as hash tag (``{orders:42}:order`` above). A key in
    another slot raises ``ValueError`` naming the tag, before the command
    is sent. On one server (or Sentinel) any keys will do.
    """

    def __init__(self, client: Redis | RedisCluster, prefix: str = "fence") -> None:
        try:
            from redis.asyncio import Redis, RedisCluster
        except ImportError as exc:  # (a store client could not have been made either)
            raise ImportError("RedisFence needs redis-py: pip install 'asynclock[redis]'") from exc
        if not isinstance(client, (Redis, RedisCluster)):
            raise TypeError(f"RedisFence needs a redis.asyncio client (Redis or RedisCluster), got {client!r}")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without '{{' or '}}', got {prefix!r}")
        self._client = client
        self._prefix = prefix
        self._cluster = isinstance(client, RedisCluster)
        self._script = client.register_script(FENCED_CALL)

    def __repr__(self) -> str:
        return f"<RedisFence prefix={self._prefix!r} client={self._client!r}>"

    def mark_key(self, resource: str) -> str:
        """The key of ``resource``'s mark: ``<prefix>:{<resource>}:mark``."""
        return f"{self._prefix}:{{{resource}}}:mark"

    async def call(self, lease_or_token: Lease | Term | int, *command: Any, resource: str | None = None) -> Any:
        """Run ``command`` (``"HSET", key, field, value``) on the store if the token is fresh.

        Fresh: not older than the mark of ``resource`` (default: the lease's
        name; required with a bare ``int`` token). The command and the
        mark's rise happen in one script, so no other write comes between.
        Returns the command's reply as Redis gives it (``b"OK"``, an int,
        bytes, a list), without the client's per-command conversions.

        Raises :class:`StaleToken` and runs nothing if a newer token already
        wrote, or if the lease is already known to be lost (then before any
        I/O). ``TypeError`` / ``ValueError`` for bad arguments, before any
        I/O. An error of the command itself (``WRONGTYPE``…) or of the
        connection is the client's own exception; the mark is not raised then.
        """
        name, token = _fenced(lease_or_token, resource)
        if not command:
            raise TypeError("call() needs a command, e.g. fence.call(lease, 'SET', key, value)")
        if isinstance(command[0], bytes):
            command = (command[0].decode(), *command[1:])
        mark = self.mark_key(name)
        keys = [mark, *await self._cluster_keys(mark, command)] if self._cluster else [mark]
        fresh, reply = await self._script(keys=keys, args=[str(token), *command])
        if not fresh:
            raise StaleToken(name, token, int(reply))
        return reply

    async def _cluster_keys(self, mark: str, command: tuple[Any, ...]) -> list[Any]:
        """The command's keys (by the cluster client's command table); each must be in the mark's slot."""
        from .backends.redis._private import COMMANDS_PARSER  # (redis-py is loaded: this is its Cluster client)

        client: Any = self._client
        await client.initialize()  # (once: the client's command table)
        keys = list(await getattr(client, COMMANDS_PARSER).get_keys(*command) or [])
        slot = client.keyslot(mark)
        elsewhere = [key for key in keys if client.keyslot(key) != slot]
        if elsewhere:
            tag = _hash_tag(mark)
            raise ValueError(
                f"on Redis Cluster a fenced command's keys must be in the slot of its mark {mark!r}: "
                f"give {elsewhere!r} the hash tag {{{tag}}} (e.g. '{{{tag}}}:data')"
            )
        return keys


class PostgresFence:
    """A fence on a PostgreSQL store, inside the caller's transaction.

    ``table`` (``name`` or ``schema.name``) keeps one row per resource: its
    mark. It is created on the first :meth:`advance` if it does not exist
    (the fence then remembers that it does: keep one fence per database).
    No I/O here::

        fence = PostgresFence()
        async with conn.transaction():
            await fence.advance(conn, lease)      # StaleToken if a newer holder wrote first
            await conn.execute("UPDATE orders SET state = 'paid' WHERE id = 42")
    """

    def __init__(self, table: str = "asynclock_fences") -> None:
        if not isinstance(table, str) or not table or "\x00" in table or any(not p for p in table.split(".")):
            raise ValueError(f"table must be a name or schema.name, got {table!r}")
        if table.count(".") > 1:
            raise ValueError(f"table must be a name or schema.name, got {table!r}")
        self._table = table
        self._quoted = ".".join('"' + part.replace('"', '""') + '"' for part in table.split("."))
        self._known = False

    def __repr__(self) -> str:
        return f"<PostgresFence table={self._table!r}>"

    @property
    def table(self) -> str:
        """The table of the marks, as given."""
        return self._table

    async def advance(
        self, conn: asyncpg.Connection, lease_or_token: Lease | Term | int, resource: str | None = None
    ) -> None:
        """Raise ``resource``'s mark to the token, inside the transaction open on ``conn``.

        Call it first in the transaction, before the writes it guards. The
        mark's row stays locked until the transaction ends, so a holder
        with a newer token waits for it, then writes after it; an older
        token raises :class:`StaleToken` (leave the ``async with
        conn.transaction()`` with it, and PostgreSQL undoes the
        transaction's writes). A lease already known to be lost raises it
        before any I/O. ``resource`` defaults to the lease's name and is
        required with a bare ``int`` token.

        ``ValueError`` if ``conn`` is not in a transaction, or for a token
        beyond a ``bigint``; ``TypeError`` for what is not a connection;
        both before any I/O. Errors of the server are asyncpg's own.
        """
        name, token = _fenced(lease_or_token, resource)
        if token > BIGINT_MAX:
            raise ValueError(f"token {token} does not fit a PostgreSQL bigint")
        in_transaction = getattr(conn, "is_in_transaction", None)
        if in_transaction is None:
            raise TypeError(f"advance() needs an asyncpg connection, got {conn!r}")
        if not in_transaction():
            raise ValueError(
                "advance() runs inside the transaction of the writes it guards: "
                "call it in `async with conn.transaction():`, before them"
            )
        import asyncpg

        if not self._known:
            await self._create(conn)
        try:
            raised = await conn.fetchval(
                f"INSERT INTO {self._quoted} AS f (resource, token) VALUES ($1, $2) "
                "ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token "
                "RETURNING f.token",
                name,
                token,
            )
        except asyncpg.UndefinedTableError:
            self._known = False  # dropped, or another database: created again next time
            raise
        if raised is None:
            mark = await conn.fetchval(f"SELECT token FROM {self._quoted} WHERE resource = $1", name)
            raise StaleToken(name, token, mark)

    async def _create(self, conn: asyncpg.Connection) -> None:
        """Create the table if it does not exist: in a savepoint, so that losing a race to
        create it (another transaction did meanwhile) leaves the caller's transaction usable."""
        import asyncpg

        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", self._quoted):
            try:
                async with conn.transaction():
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._quoted} (resource text PRIMARY KEY, token bigint NOT NULL)"
                    )
            except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError):
                pass  # created by another transaction meanwhile
        self._known = True
