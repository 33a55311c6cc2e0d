"""The ``asynclock`` command as people type it: version, help, messages,
passwords kept out of what it prints, ``inspect --timeout`` against a
server that accepts connections and never answers, and what ``inspect``
lists on every backend."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

import asynclock
from asynclock._inspect import collect
from tests.harnesses import Harness
from tests.servers import scaled


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asynclock", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose listener accepts connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def test_version() -> None:
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"asynclock {asynclock.__version__}"


def test_help_lists_only_the_public_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout and "inspect" in done.stdout and "break" in done.stdout and "--version" in done.stdout
    assert "demo-worker" not in done.stdout
    wrong = run("bogus")
    assert wrong.returncode == 2
    assert "'demo', 'inspect'" in wrong.stderr and "demo-worker" not in wrong.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("inspect",), "the following arguments are required: URL\n"),
        (("break", "memory://", "x", "--timeout", "0"), "the timeout must be between 0.01 and 3600 seconds, got 0"),
        (("demo", "--ttl", "abc"), "the ttl must be a number of seconds, got 'abc'"),
        (("demo", "--ttl", "100"), "the ttl must be between 0.2 and 60 seconds, got 100"),
        (("demo", "--workers", "x"), "the number of workers must be a whole number, got 'x'"),
        (("demo", "--workers", "9"), "the number of workers must be between 2 and 8, got 9"),
        (("inspect", "memory://", "--timeout", "soon"), "the timeout must be a number of seconds, got 'soon'"),
        (("inspect", "memory://?tll=3", "x"), "did you mean 'ttl'?"),
    ],
)
def test_messages_say_what_to_type(args: tuple[str, ...], says: str) -> None:
    done = run(*args)
    assert done.returncode in (1, 2)
    assert says in done.stderr
    assert "_ttl" not in done.stderr and "_workers" not in done.stderr and "NAME" not in done.stderr.splitlines()[-1]


def test_break_names_the_lock_it_needs() -> None:
    done = run("break", "redis://127.0.0.1:1/0")
    assert done.returncode == 2
    assert done.stderr.endswith("asynclock break: error: the following arguments are required: NAME\n")


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret-pw@127.0.0.1:{port}/0",
        "zk://127.0.0.1:{port}",
        "postgresql://app:s3cret-pw@127.0.0.1:{port}/db",
    ],
)
def test_inspect_gives_up_after_its_timeout_and_never_prints_a_password(silent_port: int, url: str) -> None:
    done = run("inspect", url.format(port=silent_port), "x", "--timeout", "1", timeout=30)
    assert done.returncode == 1
    assert "did not answer within 1 s" in done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout


@pytest.mark.anyio
@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:{port}/0", "zk://127.0.0.1:{port}", "postgresql://127.0.0.1:{port}/db"]
)
async def test_inspect_stops_at_its_timeout(silent_port: int, url: str) -> None:
    """Shorter than the backends' own bounds (seconds), so only the timeout can stop it this soon."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(asynclock.BackendUnavailable, match=r"did not answer within 0\.3 s"):
        await collect(url.format(port=silent_port), ["x"], timeout=0.3)
    assert loop.time() - started < 0.3 + scaled(1.5)


@pytest.mark.anyio
async def test_inspect_lists_the_locks_held_or_waited_for_and_no_other(harness: Harness) -> None:
    """A lock acquired and released leaves nothing to list (on ZooKeeper its znode, a
    container, stays a while with nobody under it); a held lock and one with a waiter
    queued behind its holder are listed, and nothing once they are released."""

    async def listed() -> list[str]:
        return [info.name for info in await collect(harness.url, [], prefix=harness.prefix, timeout=scaled(10))]

    holder, waiter = harness.connect(), harness.connect()
    async with holder.lock("released"):
        assert await listed() == ["released"]
    assert await listed() == []
    held = await holder.lock("held").acquire(detached=True)
    queued = await holder.lock("queued").acquire(detached=True)
    waiting = asyncio.create_task(waiter.lock("queued").acquire())
    try:
        async with asyncio.timeout(scaled(10)):
            while (await holder.lock("queued").info()).waiters == 0:  # (None where the server cannot tell)
                await asyncio.sleep(0.02)
        assert await listed() == ["held", "queued"]
    finally:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    await held.release()
    await queued.release()
    assert await listed() == []
