"""The published package: what the sdist and the wheel hold, their metadata,
and the README's install lines (from a checkout, from the built wheel), each
in a fresh virtualenv running the README's example.

The sdist must be enough to run the test suite, the benchmarks and the docs
build; the wheel holds the package and nothing else. Both are built with the
build tools of this virtualenv (``--no-isolation``), the wheel from the sdist,
as ``python -m build`` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import asynclock
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

#: What the sdist carries besides the package: the tests and whatever they read or run.
SDIST_DIRS = (".ci", "asynclock", "benchmarks", "docs", "examples", "models", "requirements", "tests")
SDIST_FILES = ("CHANGELOG.md", "LICENSE", "README.md", "compose.yaml", "mkdocs.yml", "pyproject.toml")
#: Files the build writes into the sdist itself.
SDIST_GENERATED = ("PKG-INFO", ".gitignore")
#: What a wheel's .dist-info holds.
DIST_INFO = ("METADATA", "WHEEL", "RECORD", "entry_points.txt", "licenses/LICENSE")
#: Development tools: a user's install must never pull these in.
DEV_TOOLS = ("ruff", "mypy", "pytest", "hypothesis", "kazoo", "mkdocs", "twine", "build", "hatchling")


def _local_files(top: Path) -> set[str]:
    """The files under ``top`` that belong in the sdist (no caches, no benchmark results), relative to ROOT."""
    found = set()
    for path in top.rglob("*"):
        relative = path.relative_to(ROOT)
        if not path.is_file() or "__pycache__" in relative.parts or path.suffix == ".pyc":
            continue
        if relative.parts[:2] == ("benchmarks", "results"):
            continue
        found.add(relative.as_posix())
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {dist}, found {found}"
    return found[0]


def test_sdist_holds_what_the_tests_benchmarks_and_docs_need(dist: Path) -> None:
    sdist = _one(dist, f"asynclock-{asynclock.__version__}.tar.gz")
    top = f"asynclock-{asynclock.__version__}/"
    with tarfile.open(sdist) as archive:
        names = {member.name.removeprefix(top) for member in archive.getmembers() if member.isfile()}
    expected = set(SDIST_FILES).union(*(_local_files(ROOT / directory) for directory in SDIST_DIRS))
    assert "tests/test_package.py" in expected and "docs/index.md" in expected  # the walk found the tree
    assert expected - names == set(), "missing from the sdist"
    assert names - expected - set(SDIST_GENERATED) == set(), "unexpected in the sdist"


def test_wheel_holds_only_the_package_its_scripts_and_py_typed(dist: Path) -> None:
    wheel = _one(dist, f"asynclock-{asynclock.__version__}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    info = f"asynclock-{asynclock.__version__}.dist-info/"
    package = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "asynclock").rglob("*")
        if path.is_file()
        and (path.suffix in (".py", ".lua") or path.name == "py.typed")
        and "__pycache__" not in path.parts
    }
    assert "asynclock/py.typed" in package
    assert "asynclock/backends/redis/_scripts/hash_acquire.lua" in package  # the Lua scripts are package data
    assert names == package | {info + name for name in DIST_INFO}


def test_metadata_one_version_license_and_no_dev_tools(dist: Path) -> None:
    wheel = _one(dist, "*.whl")
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"asynclock-{asynclock.__version__}.dist-info/METADATA").decode()
    metadata = Parser().parsestr(text)
    assert metadata["Version"] == asynclock.__version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    urls = {entry.split(",")[0] for entry in metadata.get_all("Project-URL") or []}
    assert {"Documentation", "Changelog", "Source", "Issues"} <= urls
    classifiers = metadata.get_all("Classifier") or []
    assert "Framework :: AsyncIO" in classifiers and "Typing :: Typed" in classifiers
    assert set(metadata.get_all("Provides-Extra") or []) == {
        "redis",
        "zookeeper",
        "postgres",
        "mysql",
        "etcd",
        "otel",
        "examples",
        "all",
    }
    required = {re.split(r"[\s<>=!~;\[]", entry, maxsplit=1)[0].lower() for entry in metadata.get_all("Requires-Dist")}
    assert required & set(DEV_TOOLS) == set()


def test_readme_links_and_images_work_on_a_package_index(dist: Path) -> None:
    """The long description is the README; an index shows it away from the
    repository, so a relative link or image would be broken there."""
    with zipfile.ZipFile(_one(dist, "*.whl")) as archive:
        text = archive.read(f"asynclock-{asynclock.__version__}.dist-info/METADATA").decode()
    readme = Parser().parsestr(text).get_payload()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"<([a-z][a-z+.-]*:[^>\s]+)>", readme)
    assert targets, "the README links to its documentation"
    assert [target for target in targets if not target.startswith("https://")] == []


def test_twine_check_strict_passes(dist: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2


def readme_install_lines() -> list[str]:
    """The README's install commands (the ``pip install`` lines of its first ``sh`` block), without comments."""
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None, "the README has an install block"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    assert lines and all(line.startswith("pip install ") for line in lines), lines
    return lines


def _run_readme_example(python: Path, port: int, cwd: Path) -> None:
    """The README's first example, pointed at a real redis-server, with the interpreter of a fresh virtualenv."""
    first = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert first is not None
    example = first.group(1).replace('"memory://"', f'"redis://127.0.0.1:{port}/0"')
    assert "redis://" in example, "the README's example connects with a URL this test can point at Redis"
    done = subprocess.run(
        [str(python), "-c", example],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,  # not the checkout: the installed package, not the source tree, is imported
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Redis's first token for a name is the server's time in microseconds; memory:// counts from 1
    token = re.search(r"fencing token (\d+)", done.stdout)
    assert token is not None and int(token.group(1)) > 10**15, done.stdout
    version = subprocess.run(
        [str(python.parent / "asynclock"), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version.stdout.strip() == f"asynclock {asynclock.__version__}"


def _install(line: str, cwd: Path, venv: Path) -> Path:
    """Run one README install line, as typed, in ``cwd`` with a fresh virtualenv's pip first on PATH."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    install = subprocess.run(
        ["sh", "-c", line.replace("pip install ", "pip install -q ", 1)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv / "bin" / "python"


def test_the_readme_installs_from_a_checkout_and_from_the_built_wheel(
    dist: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    """What a user does before the package is on an index: each of the README's
    install lines, typed as it is (from the checkout; from ``dist/`` holding
    the built wheel) into an empty virtualenv, whose dependencies come from
    the index; then the README's first example against a real redis-server."""
    checkout, wheel = readme_install_lines()
    assert "'.[redis]'" in checkout and "dist/" in wheel and "[redis]" in wheel
    python = _install(checkout, ROOT, tmp_path / "from-checkout")
    _run_readme_example(python, redis_server.port, tmp_path)
    built = tmp_path / "built"
    (built / "dist").mkdir(parents=True)
    (built / "dist" / _one(dist, "*.whl").name).symlink_to(_one(dist, "*.whl"))
    python = _install(wheel, built, tmp_path / "from-wheel")
    _run_readme_example(python, redis_server.port, tmp_path)
