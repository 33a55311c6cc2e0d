"""The contract of one hold: acquire and release, the lease's fields, re-entry, who may release, names, arguments."""

from __future__ import annotations

import asyncio
import math

import pytest

from asynclock import NotHeld

from ._harness import TTL, Harness, has_tokens, scaled

__all__ = ["Holding"]


class Holding:
    """A hold and its lease: acquired, re-entered and released by its owner only; names
    kept apart; bad arguments refused before any I/O."""

    async def test_acquire_release_and_lease_fields(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("basic")
        assert not lock.held
        lease = await lock.acquire()
        loop = asyncio.get_running_loop()
        assert lease.name == "basic"
        assert isinstance(lease.token, int) if has_tokens(harness) else lease.token is None
        assert lease.hold_count == 1
        assert lease.expires_at > loop.time()
        assert not lease.lost
        assert lock.held
        info = await lock.info()
        assert info.owner is not None and info.owner.startswith(locks.client_id)
        assert info.key == lock.key
        assert info.token == lease.token
        await lock.release()
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_async_with_releases_on_exit_and_on_error(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("with")
        async with lock as lease:
            assert lock.held and lease.hold_count == 1
        assert not lock.held
        with pytest.raises(ZeroDivisionError):
            async with lock:
                1 / 0  # noqa: B018
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_reentry_counts_holds_and_keeps_token(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("re")
        async with lock as outer:
            async with lock as inner:
                assert inner is outer
                assert inner.hold_count == 2
                if harness.server_counts:
                    assert (await lock.info()).hold_count == 2
            assert outer.hold_count == 1 and lock.held
            assert (await lock.info()).owner is not None
        assert not lock.held
        assert (await lock.info()).owner is None

    async def test_release_by_non_owner_double_release_and_after_loss(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        lock = locks.lock("owner")
        lease = await lock.acquire()

        async def intruder() -> None:
            with pytest.raises(NotHeld):
                await lock.release()

        await asyncio.create_task(intruder())
        other_client = harness.connect(ttl=TTL)
        with pytest.raises(NotHeld):
            await other_client.lock("owner").release()
        info = await lock.info()
        assert info.owner is not None and info.token == lease.token, "a non-owner release changed the server"
        await lock.release()
        with pytest.raises(NotHeld):
            await lock.release()

        lease = await lock.acquire()
        assert await harness.expire("owner")
        await asyncio.wait_for(lease.wait_lost(), scaled(5))
        with pytest.raises(NotHeld):
            await lock.release()

    async def test_unicode_and_odd_names_are_distinct_locks(self, harness: Harness) -> None:
        locks = harness.connect(ttl=TTL)
        names = ["ключ", "a/b", "a//b", "a/b/", "..", ".", "a b", "{x}", "x}", "%2F", "a\x00b", "a\nb", "🔒"]
        leases = []
        for name in names:
            leases.append(await locks.lock(name).acquire(timeout=0))
        keys = {locks.lock(name).key for name in names}
        assert len(keys) == len(names)
        for name in names:
            await locks.lock(name).release()

    @pytest.mark.parametrize(
        ("make", "error"),
        [
            (lambda locks: locks.lock(""), ValueError),
            (lambda locks: locks.lock(42), TypeError),
            (lambda locks: locks.lock(b"bytes"), TypeError),
            (lambda locks: locks.lock("x" * 100_000), ValueError),
            (lambda locks: locks.lock("\udcff"), ValueError),
            (lambda locks: locks.lock("n", ttl=0), ValueError),
            (lambda locks: locks.lock("n", ttl=-1), ValueError),
            (lambda locks: locks.lock("n", ttl=math.nan), ValueError),
            (lambda locks: locks.lock("n", ttl=math.inf), ValueError),
            (lambda locks: locks.lock("n", ttl="5"), TypeError),
            (lambda locks: locks.lock("n", ttl=True), TypeError),
        ],
    )
    async def test_bad_arguments_raise_before_any_io(
        self, harness: Harness, make: object, error: type[Exception]
    ) -> None:
        locks = harness.connect(ttl=TTL)
        assert callable(make)
        with pytest.raises(error):
            make(locks)

    @pytest.mark.parametrize("timeout", [-1, -0.001, math.nan, "1"])
    async def test_bad_timeout_raises_before_any_io(self, harness: Harness, timeout: object) -> None:
        locks = harness.connect(ttl=TTL)
        with pytest.raises((ValueError, TypeError)):
            await locks.lock("t").acquire(timeout=timeout)  # type: ignore[arg-type]
        assert (await locks.lock("t").info()).owner is None
