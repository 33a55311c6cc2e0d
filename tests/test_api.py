"""The public face: exports, the quickstart in the README, optional extras."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import asynclock

ROOT = Path(__file__).resolve().parent.parent


def test_all_lists_exactly_the_public_names_sorted() -> None:
    public = {
        name
        for name, value in vars(asynclock).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(asynclock.__all__) - {"__version__"} == public
    assert list(asynclock.__all__) == sorted(asynclock.__all__)


def test_exception_tree() -> None:
    assert issubclass(asynclock.LockTimeout, asynclock.LockError)
    assert issubclass(asynclock.LockTimeout, TimeoutError)
    assert issubclass(asynclock.BackendUnavailable, ConnectionError)
    for exc in (asynclock.LockLost, asynclock.NotHeld, asynclock.BackendUnavailable):
        assert issubclass(exc, asynclock.LockError)
    lost = asynclock.LockLost("n", "why")
    assert lost.name == "n" and lost.reason == "why"


def test_readme_quickstart_runs_and_is_short() -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, re.S)
    assert first is not None
    code = first.group(1)
    assert len(code.strip().splitlines()) < 15
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "fencing token" in done.stdout


def test_import_needs_no_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None; import asynclock; "
        "import asyncio; asyncio.run(asynclock.connect('memory://').aclose()); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_missing_extra_gives_an_install_hint() -> None:
    code = "import sys; sys.modules['redis'] = None; import asynclock; asynclock.connect('redis://127.0.0.1:1/0')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "pip install 'asynclock[redis]'" in done.stderr


def test_public_classes_say_they_are_asynclocks() -> None:
    """Tracebacks and reprs show ``asynclock.Lock``, not the private module it lives in."""
    for name in asynclock.__all__:
        value = getattr(asynclock, name)
        if isinstance(value, type):
            assert value.__module__ == "asynclock", name
    assert repr(asynclock.Lock) == "<class 'asynclock.Lock'>"
    lost = asynclock.LockLost("n", "why", asynclock.LossReason.CONNECTION_LOST)
    assert lost.loss is asynclock.LossReason.CONNECTION_LOST


@pytest.mark.parametrize(
    "url",
    [
        "zk://me:secret@h1:2181,h2:x/app",
        "zk://me:secret@h1:2181,:2181",
        "etcd://me:secret@127.0.0.1:0",
        "etcd://me:secret@[::1]x",
        "redis+cluster://:secret@127.0.0.1:7000,127.0.0.1",
        "redis+sentinel://:secret@127.0.0.1:70000/mymaster",
    ],
)
def test_a_bad_host_list_is_refused_before_any_io_without_its_password(url: str) -> None:
    with pytest.raises(ValueError, match="as host:port, got") as refused:
        asynclock.connect(url)
    assert "secret" not in str(refused.value)


def test_a_host_list_reads_ipv6_and_default_ports() -> None:
    from asynclock._options import host_list

    assert host_list("[::1]:5,h3", "zk://x", "servers", default_port=2181) == [("::1", 5), ("h3", 2181)]
    assert host_list("a:1,b:2", "redis+cluster://x", "nodes") == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="nodes as host:port, got 'b'"):
        host_list("a:1,b", "redis+cluster://x", "nodes")  # no default port: every host names its own
