"""What the Redis backends read of redis-py and asyncio beyond their public API, in one place.

redis-py offers no public way to the stream pair of a connected connection,
which the hand-over path takes over (``_listen.py``, ``backends/_takeover.py``),
nor to the bytes a stream read ahead, nor to a Sentinel's forced primary
address; and Cluster's command-table reader lives in a private module. Each
is named here once, the code reads it through these names, and
``tests/test_redis.py`` checks every entry of :data:`PRIVATE` against the
installed versions (on a real connection), so that a release that moves one
fails that test, naming the attribute and the version, rather than a
hand-over in production. ``pyproject.toml`` bounds redis-py below its next
major version for the same reason.
"""

from __future__ import annotations

from typing import NamedTuple

from .._takeover import STREAM_BUFFER

__all__ = ["COMMANDS_PARSER", "FORCE_MASTER_IP", "PRIVATE", "READER", "STREAM_BUFFER", "WRITER", "Private"]

#: redis-py's asyncio connection: its ``asyncio.StreamReader`` and ``StreamWriter`` once connected.
READER = "_reader"
WRITER = "_writer"
#: redis-py's asyncio ``Sentinel``: its ``force_master_ip`` argument (None: the address the sentinels give).
FORCE_MASTER_IP = "_force_master_ip"
#: redis-py's asyncio ``RedisCluster``: the parser that finds a command's keys (``get_keys``).
COMMANDS_PARSER = "commands_parser"


class Private(NamedTuple):
    """One private name we rely on: ``attribute`` of ``owner`` (a dotted path), as used in ``used_in``.

    ``library``: the distribution whose version decides it ("python" for asyncio).
    """

    library: str
    owner: str
    attribute: str
    used_in: str


#: Every private name the Redis backends read.
PRIVATE: tuple[Private, ...] = (
    Private("redis", "redis.asyncio.connection.AbstractConnection", READER, "redis/_listen.py"),
    Private("redis", "redis.asyncio.connection.AbstractConnection", WRITER, "redis/_listen.py"),
    Private("python", "asyncio.StreamReader", STREAM_BUFFER, "backends/_takeover.py"),
    Private("redis", "redis.asyncio.sentinel.Sentinel", FORCE_MASTER_IP, "redis/sentinel.py"),
    Private("redis", "redis._parsers", "AsyncCommandsParser", "redis/cluster.py"),
    Private("redis", "redis._parsers.base.BaseParser", "parse_error", "redis/_listen.py"),
    # not underscored, but not documented either: where a Cluster client finds a command's keys
    Private("redis", "redis.asyncio.cluster.RedisCluster", COMMANDS_PARSER, "fencing.py"),
)
