"""Every ``python`` code block of README.md and of the documentation pages
runs, against real servers, so no example can rot.

How a block runs:

* A complete program (it calls ``asyncio.run``) runs as a script of its own,
  in a subprocess.
* A test module (it defines a ``test_…`` function) runs under pytest, in a
  subprocess, with asynclock's pytest plugin on (the ``locks`` fixture), and
  every test in it must pass.
* Any other block is a snippet: it runs with top-level ``await`` in one
  namespace per page, so a later block may use what an earlier one made.
  The namespace starts with ``asyncio``, ``asynclock``, ``log`` (a logger),
  ``url`` (a Redis server), ``locks`` (a ``memory://`` client, again
  whenever an earlier block left ``locks`` closed), and
  stand-ins for the application's own work that examples call
  (``build_report``, ``charge``, …: coroutines that do nothing).

Server addresses written in a block (``redis://localhost:6379/0``,
``zk://zk1:2181,zk2:2181/app``, ``postgresql://app@db.example/app``,
``etcd://etcd1:2379,etcd2:2379/app``, ``mysql://app:pw@db.example/app``) are
pointed at the test servers before it runs; the rest of the URL (database,
chroot, key path, query) is kept, and a MySQL database it names is made.
The test servers speak no TLS: ``rediss://`` and ``etcds://`` are pointed at
the plain ones, so a block that needs certificate files belongs in a
``text`` block.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import secrets
import subprocess
import sys
import tempfile
import types
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

import asynclock
from tests.harnesses import insides

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: a block that defines a test is a test module
TEST_MODULE = re.compile(r"^(async )?def test_", re.M)
#: scheme://hosts of the servers a block may name (the part that is replaced)
SERVER = re.compile(r"\b(redis|rediss|zk|postgresql|postgres|etcd|etcds|mysql|mariadb)://([^/\s\"'?]+)")

#: The application's own work, as examples call it.
APP_WORK = (
    "build_report",
    "charge",
    "load",
    "store",
    "send_invoices",
    "run_scheduler",
    "process",
    "handle",
)


def blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, code) of each python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, match.start()) + 2, match.group(1)) for match in FENCE.finditer(text)]


async def _nothing(*args: object, **kwargs: object) -> None:
    await asyncio.sleep(0)


class Servers:
    """The test servers a page's blocks name, started on first use."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def address(self, scheme: str) -> str:
        if scheme in ("redis", "rediss"):
            server = self._request.getfixturevalue("redis_server")
            return f"redis://127.0.0.1:{server.port}"
        if scheme == "zk":
            return f"zk://127.0.0.1:{self._request.getfixturevalue('zookeeper_server').port}"
        if scheme in ("etcd", "etcds"):
            return f"etcd://127.0.0.1:{self._request.getfixturevalue('etcd_server').port}"
        if scheme in ("mysql", "mariadb"):
            return f"{scheme}://root@127.0.0.1:{self._request.getfixturevalue('mysql_server').port}"
        dsn: str = self._request.getfixturevalue("postgres_server").dsn
        return dsn.split("/", 3)[0] + "//" + dsn.split("/", 3)[2]

    def rewrite(self, code: str) -> str:
        def swap(match: re.Match[str]) -> str:
            return self.address(match.group(1))

        return SERVER.sub(swap, code)


async def make_chroots(code: str, servers: Servers) -> None:
    """Create the ZooKeeper chroots a block names (a chroot must exist before a client uses it)."""
    for chroot in re.findall(r"zk://[^/\s\"']+(/[^?\s\"']+)", code):
        from kazoo.client import KazooClient

        client = KazooClient(hosts=servers.address("zk").removeprefix("zk://"))
        await asyncio.to_thread(client.start, 10)
        try:
            await asyncio.to_thread(client.ensure_path, chroot)
        finally:
            await asyncio.to_thread(client.stop)
            await asyncio.to_thread(client.close)


async def make_databases(code: str, servers: Servers) -> None:
    """Create the MySQL databases a block names (the fence table lives in one)."""
    for database in re.findall(r"(?:mysql|mariadb)://[^/\s\"']+/(\w+)", code):
        server = servers._request.getfixturevalue("mysql_server")
        await asyncio.to_thread(server.sql, f"CREATE DATABASE IF NOT EXISTS `{database}`")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


#: Pages whose blocks fail for a known reason, until it is fixed (strict: a fix shows).
KNOWN: dict[str, str] = {}


def _page(page: Path) -> Any:
    reason = KNOWN.get(page_id(page))
    return pytest.param(page, marks=pytest.mark.xfail(reason=reason, strict=True)) if reason else page


@pytest.mark.anyio
@pytest.mark.parametrize("page", [_page(page) for page in PAGES], ids=page_id)
async def test_every_python_block_runs(page: Path, request: pytest.FixtureRequest) -> None:
    found = blocks(page)
    if not found:
        pytest.skip("no python blocks")
    servers = Servers(request)
    prefix = f"docs{secrets.token_hex(3)}"
    default = asynclock.connect("memory://", prefix=prefix)
    namespace: dict[str, Any] = {
        "__name__": f"docs:{page.name}",
        "asyncio": asyncio,
        "asynclock": asynclock,
        "log": logging.getLogger("docs"),
        "locks": default,
        **{name: _nothing for name in APP_WORK},
    }
    try:
        for line, code in found:
            where = f"{page_id(page)}:{line}"
            code = servers.rewrite(code)
            await make_chroots(code, servers)
            await make_databases(code, servers)
            if "asyncio.run(" in code:
                await run_program(code, where)
                continue
            if TEST_MODULE.search(code):
                await run_test_module(code, where)
                continue
            namespace["url"] = servers.address("redis") + "/0" if "url" in code else None
            if insides.core(namespace["locks"]).closed:  # an earlier block's ``async with connect(...) as locks`` ended
                namespace["locks"] = default
            compiled: CodeType = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            outcome = eval(compiled, namespace)
            if asyncio.iscoroutine(outcome):
                async with asyncio.timeout(30):
                    await outcome
    finally:
        for value in [*namespace.values(), default]:
            if isinstance(value, asynclock.Locks):
                await value.aclose()


async def run_program(code: str, where: str) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


async def run_test_module(code: str, where: str) -> None:
    done = await asyncio.to_thread(pytest_on, code)
    assert done.returncode == 0 and " passed" in done.stdout, f"{where}: a test failed:\n{done.stdout}\n{done.stderr}"


def pytest_on(code: str) -> subprocess.CompletedProcess[str]:
    """pytest run on ``code`` as a test module of its own, with asynclock's fixtures on."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_block.py").write_text(code)
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--asynclock-fixtures", "test_block.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def test_the_runner_finds_and_points_blocks_at_the_test_servers() -> None:
    """The runner itself: blocks are found with their line numbers, and every
    server address in them is replaced (so a block cannot reach a real host)."""
    readme = blocks(ROOT / "README.md")
    assert readme, "README.md has python blocks"
    assert all(ROOT.joinpath("README.md").read_text().splitlines()[line - 2] == "```python" for line, _ in readme)

    class Fixed(Servers):
        def address(self, scheme: str) -> str:
            return f"{scheme}://test-server"

    rewrite: Callable[[str], str] = Fixed(None).rewrite  # type: ignore[arg-type]
    assert rewrite('connect("redis://localhost:6379/0")') == 'connect("redis://test-server/0")'
    assert rewrite('"zk://zk1:2181,zk2:2181/app?session_timeout=10"') == '"zk://test-server/app?session_timeout=10"'
    assert rewrite("postgresql://app:pw@db.example:5432/app") == "postgresql://test-server/app"
    assert rewrite('connect("etcd://etcd1:2379,etcd2:2379/app")') == 'connect("etcd://test-server/app")'
    assert rewrite("etcds://root:pw@etcd1:2379/app?connect_timeout=2") == "etcds://test-server/app?connect_timeout=2"
    assert rewrite('connect("mysql://app:secret@db.example:3306/app")') == 'connect("mysql://test-server/app")'
    assert rewrite("etcdctl lock /app/asynclock/orders") == "etcdctl lock /app/asynclock/orders"

    class Fixtures:
        """The fixtures ``Servers`` asks for, as servers on port 1234."""

        def getfixturevalue(self, name: str) -> object:
            assert name == "etcd_server", name
            return types.SimpleNamespace(port=1234)

    # the test etcd speaks no TLS: etcds:// goes to it as etcd://
    servers = Servers(Fixtures())  # type: ignore[arg-type]
    assert servers.rewrite("etcds://etcd1:2379,etcd2:2379/app") == "etcd://127.0.0.1:1234/app"
    assert servers.rewrite("etcd://etcd1:2379") == "etcd://127.0.0.1:1234"


def test_the_readme_serves_the_docs_with_what_its_test_command_installs() -> None:
    """``.venv/bin/mkdocs serve`` after ``bash tests/run.sh``: the test command
    installs requirements/dev.txt, which must carry MkDocs and every plugin
    mkdocs.yml names, and the README's address is where ``serve`` puts the site
    (MkDocs serves under the path of ``site_url``)."""
    readme = (ROOT / "README.md").read_text()
    serve = re.search(r"^\.venv/bin/mkdocs serve +# (http://\S+)$", readme, re.M)
    assert serve is not None, "the README says how to serve the docs"
    site_url = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site_url is not None
    assert serve.group(1) == "http://127.0.0.1:8000" + urllib.parse.urlsplit(site_url.group(1)).path
    assert "bash tests/run.sh" in readme.split(serve.group(0))[0].rsplit("```", 2)[-2]
    run = (ROOT / "tests" / "run.sh").read_text()
    assert "-r requirements/dev.txt" in run
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    for needed in ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python"):
        assert re.search(rf"^{re.escape(needed)}[=<>]", dev, re.M), needed
