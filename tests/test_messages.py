"""Mistakes and failures name themselves in the user's words.

* An unknown option lists the valid ones as each backend's docs page lists
  them (parsed from the page, so the two cannot drift apart), never the
  dozens of names a client library's signatures hold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import asynclock

DOCS = Path(__file__).resolve().parent.parent / "docs" / "backends"
#: What every backend takes (``on_event`` as a keyword only).
EVERY_CLIENT = {"ttl", "prefix", "connect_timeout", "on_event"}
_NAME = re.compile(r"`([a-z][a-z0-9_]*)`")


def documented(page: str, section: str | None = None) -> set[str]:
    """The options a backend's docs page lists: the backquoted names of its
    ``**Options**`` paragraph (in ``section``, a ``## `` heading) and of the first
    column of the table right after it."""
    text = (DOCS / page).read_text()
    if section is not None:
        text = text[text.index(f"\n## {section}\n") + 1 :]
        end = text.find("\n## ")
        text = text if end < 0 else text[:end]
    paragraphs = text.split("\n\n")
    for index, paragraph in enumerate(paragraphs):
        if re.match(r"\*\*(Options|URL and options)", paragraph):
            names = set(_NAME.findall(paragraph))
            table = paragraphs[index + 1] if index + 1 < len(paragraphs) else ""
            if table.startswith("|"):
                for row in table.splitlines()[2:]:
                    names |= set(_NAME.findall(row.split("|")[1]))
            return names
    raise AssertionError(f"no **Options** paragraph in {page} {section or ''}")


def listed(message: str) -> set[str]:
    """The options an unknown-option message lists as valid."""
    found = re.search(r"\(valid: ([a-z_, ]+)[;)]", message)
    assert found is not None, message
    return set(found.group(1).split(", "))


OPTION_PAGES = [
    pytest.param("memory://", "memory.md", None, id="memory"),
    pytest.param("redis://127.0.0.1:1/0", "redis.md", "One Redis server", id="redis"),
    pytest.param("rediss://127.0.0.1:1/0", "redis.md", "One Redis server", id="rediss"),
    pytest.param("unix:///nonexistent/redis.sock", "redis.md", "One Redis server", id="unix"),
    pytest.param("redis+sentinel://127.0.0.1:1/mymaster", "redis.md", "Sentinel", id="sentinel"),
    pytest.param("redis+cluster://127.0.0.1:1", "redis.md", "Cluster", id="cluster"),
    pytest.param("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "redlock.md", None, id="redlock"),
    pytest.param("zk://127.0.0.1:1", "zookeeper.md", None, id="zookeeper"),
    pytest.param("etcd://127.0.0.1:1", "etcd.md", None, id="etcd"),
    pytest.param("etcds://127.0.0.1:1", "etcd.md", None, id="etcds"),
    pytest.param("postgresql://app@127.0.0.1:1/db", "postgresql.md", None, id="postgresql"),
]


@pytest.mark.parametrize(("url", "page", "section"), OPTION_PAGES)
def test_an_unknown_option_lists_the_options_the_docs_list(url: str, page: str, section: str | None) -> None:
    """As a keyword and as a URL parameter (where ``on_event``, a callback, cannot be),
    before any I/O; the closest name is still suggested."""
    docs = documented(page, section)
    assert docs >= EVERY_CLIENT, docs  # (the paragraph was found)
    with pytest.raises(ValueError, match="did you mean 'ttl'") as keyword:
        asynclock.connect(url, tll=5)
    assert listed(str(keyword.value)) == docs, str(keyword.value)
    joiner = "&" if "?" in url else "?"
    with pytest.raises(ValueError, match="did you mean 'ttl'") as parameter:
        asynclock.connect(f"{url}{joiner}tll=5")
    assert listed(str(parameter.value)) == docs - {"on_event"}, str(parameter.value)


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_a_given_redis_client_lists_the_options_the_docs_list(kind: str) -> None:
    if kind == "redis":
        client: Any = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
        docs = documented("redis.md", "One Redis server")
    else:
        client = aioredis.RedisCluster(host="127.0.0.1", port=1)
        docs = documented("redis.md", "Cluster")
    with pytest.raises(ValueError, match="did you mean 'ttl'") as caught:
        asynclock.connect(client, tll=5)
    assert listed(str(caught.value)) == docs


@pytest.mark.anyio
async def test_a_given_asyncpg_pool_lists_the_options_the_docs_list() -> None:
    import asyncpg

    pool = await asyncpg.create_pool("postgresql://app@127.0.0.1:1/db", min_size=0)
    try:
        with pytest.raises(ValueError, match="did you mean 'ttl'") as caught:
            asynclock.connect(pool, tll=5)
        assert listed(str(caught.value)) == documented("postgresql.md")
    finally:
        await pool.close()


def test_the_options_of_a_client_library_are_named_in_words_and_still_taken() -> None:
    """redis-py's signatures hold dozens of names (internals among them): the message
    says they go to redis-py instead of listing them, and a typo of one is still
    told the closest."""
    with pytest.raises(ValueError) as caught:
        asynclock.connect("redis://127.0.0.1:1/0?socket_timout=1")
    text = str(caught.value)
    assert "did you mean 'socket_timeout'" in text
    assert "and what redis-py's Redis.from_url takes" in text
    assert "maint_notifications" not in text and "connection_class" not in text, text
    asynclock.connect("redis://127.0.0.1:1/0?socket_timeout=1", health_check_interval=5)  # still taken
