"""The pytest fixtures of asynclock's testing kit (``asynclock.testing.locks``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .._client import Locks
from ._clients import memory_client

__all__ = ["locks"]


@pytest.fixture
async def locks() -> AsyncIterator[Locks]:
    """A ``memory://`` client of this test's own (its own key prefix), closed after the test.

    The test fails (an error at teardown, naming what) if it leaves a lease
    held or an acquire waiting on it, once every fixture that uses it has
    been torn down. Use it from async tests that run on asyncio under anyio's
    pytest plugin, which comes with asynclock (``@pytest.mark.anyio``).
    """
    leaked = None
    try:
        async with memory_client() as client:
            yield client
    except AssertionError as error:
        leaked = str(error)
    if leaked is not None:
        pytest.fail(f"asynclock: {leaked}", pytrace=False)
