"""``locks.check(name, token)``: whether a token is the current holder's, one
read, on every backend; what a downstream service calls with a token it was
sent."""

from __future__ import annotations

import asyncio

import pytest

import asynclock
from tests.harnesses import Harness
from tests.servers import free_port, scaled

pytestmark = pytest.mark.anyio

TTL = scaled(0.6)


async def test_only_the_current_holders_token_checks_out(harness: Harness) -> None:
    holder, downstream = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    if not harness.has_tokens:
        # refused before any I/O, held or not: the backend says it has no tokens
        assert "fencing" not in downstream.guarantees
        with pytest.raises(NotImplementedError, match="fencing tokens"):
            await downstream.check("checked", 1)
        async with holder.lock("checked"):
            with pytest.raises(NotImplementedError, match="fencing tokens"):
                await downstream.check("checked", 1)
        return
    assert await downstream.check("checked", 1) is False  # never used
    lease = await holder.lock("checked").acquire()
    assert lease.token is not None
    assert await downstream.check("checked", lease.token) is True
    assert await holder.check("checked", lease.token) is True
    assert await downstream.check("checked", lease.token - 1) is False
    assert await downstream.check("checked", lease.token + 1) is False
    assert await downstream.check("other", lease.token) is False
    await holder.lock("checked").release()
    assert await downstream.check("checked", lease.token) is False  # free now
    async with downstream.lock("checked") as second:
        assert second.token is not None and second.token > lease.token
        assert await holder.check("checked", lease.token) is False
        assert await holder.check("checked", second.token) is True


async def test_a_lost_holders_token_stops_checking_out_once_another_holds(harness: Harness) -> None:
    if not harness.has_tokens:
        pytest.skip("no fencing tokens on this backend")
    holder, other = harness.connect(ttl=TTL), harness.connect(ttl=TTL)
    lost = False
    stale: int | None = None
    try:
        async with holder.lock("expired") as lease:
            stale = lease.token
            assert await other.check("expired", lease.token) is True
            assert await harness.expire("expired")
            async with other.lock("expired").acquire(timeout=scaled(10)) as fresh:
                assert await holder.check("expired", lease.token) is False
                assert fresh.token is not None and await holder.check("expired", fresh.token) is True
            await asyncio.sleep(scaled(10))
    except asynclock.LockLost:
        lost = True
    assert lost and stale is not None


async def test_bad_arguments_are_refused_before_any_io() -> None:
    # Nothing listens there: an argument error must come before any attempt to connect.
    locks = asynclock.connect(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=scaled(5))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TypeError, match="token must be an int"):
        await locks.check("n", "17")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token must be an int"):
        await locks.check("n", True)
    with pytest.raises((TypeError, ValueError)):
        await locks.check("", 17)
    assert loop.time() - started < scaled(1)
    await locks.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await locks.check("n", 17)
