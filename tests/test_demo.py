"""``python -m asynclock demo``, run the way a user runs it, as a child process.

Its output must tell the whole story it promises: acquisitions with tokens,
handoffs, watchdog renewals, a holder that dies and its lock coming back, a
lease lost with LockLost; it must exit 0 and leave no process behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.servers import RedisServer, redis_server_binary, scaled

TTL = scaled(0.8)
DEADLINE = scaled(90)


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "asynclock", "demo", "--ttl", str(TTL), *args]


def default_sigint() -> None:
    # A shell may start us with SIGINT ignored; the child must see it as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_demo(*args: str) -> str:
    done = subprocess.run(
        demo_command(*args), capture_output=True, text=True, timeout=DEADLINE, preexec_fn=default_sigint
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stderr == "", done.stderr
    return done.stdout


def check_story(out: str, *, holder_fate: str) -> None:
    acquired = re.findall(r"acquired\s+token (\d+)", out)
    assert len(acquired) >= 4, out
    tokens = [int(token) for token in acquired]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), f"tokens must increase: {tokens}"
    assert re.search(r"handoff from w\d in [\d.]+m?s", out), out
    assert re.search(r"renewed\s+token \d+: good for [\d.]+s more", out), out
    assert re.search(rf"lock back [\d.]+s after w\d {holder_fate} holding it", out), out
    assert re.search(r"lost\s+token \d+: the server no longer ha[sd] this hold", out), out
    assert re.search(r"LockLost\s+out of `async with`", out), out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("summary: ") and "median handoff latency" in summary, summary
    assert "\033[" not in out, "no colour when stdout is not a terminal"


def pids_in(out: str) -> list[int]:
    return sorted({int(pid) for pid in re.findall(r"\(pid (\d+)", out)})


def assert_gone(pids: list[int]) -> None:
    """Every process the demo started has exited (zombies excepted while they get reaped)."""
    deadline = time.monotonic() + scaled(10)
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _alive(pid)]
        time.sleep(0.05)
    assert not left, f"still running: {left}"


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(redis_server_binary() is None, reason="the embedded default needs redis-server on PATH")
def test_demo_on_embedded_redis_server() -> None:
    out = run_demo()
    assert "worker processes" in out and "throwaway redis-server (pid" in out, out
    check_story(out, holder_fate="died")
    assert "SIGKILL w" in out, out
    pids = pids_in(out)
    assert len(pids) == 4, f"the server and three workers: {pids}"
    assert_gone(pids)


def test_demo_on_memory() -> None:
    out = run_demo("--url", "memory://")
    assert "worker threads" in out, out
    check_story(out, holder_fate="froze")
    assert "no worker can be killed" in out, "the timeline says what it shows instead of a crash"


def test_demo_on_a_given_server_cleans_up(redis_server: RedisServer) -> None:
    import redis

    out = run_demo("--url", redis_server.url, "--workers", "2")
    check_story(out, holder_fate="died")
    prefix = re.search(r"delete key '([^:']+):", out)
    assert prefix is not None, out
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        assert client.keys(f"{prefix.group(1)}:*") == [], "the demo leaves nothing on the user's server"
    finally:
        client.close()


@pytest.mark.skipif(redis_server_binary() is None, reason="the embedded default needs redis-server on PATH")
def test_demo_ctrl_c_stops_workers_and_server() -> None:
    proc = subprocess.Popen(
        demo_command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint
    )
    timer = threading.Timer(DEADLINE, proc.kill)  # bounds the blocking reads below
    timer.start()
    try:
        assert proc.stdout is not None
        seen = ""
        while not ("acquired" in seen and seen.count("connected (pid") == 3):
            line = proc.stdout.readline()
            assert line, f"the demo ended early:\n{seen}"
            seen += line
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=scaled(20))
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = seen + rest
    assert proc.returncode == 130, out
    assert "interrupted: workers and server stopped" in out, out
    pids = pids_in(out)
    assert len(pids) == 4, pids
    assert os.getpid() not in pids
    assert_gone(pids)
