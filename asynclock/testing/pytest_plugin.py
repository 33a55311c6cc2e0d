"""asynclock's pytest plugin: pytest loads it (entry point ``pytest11``), and it does
nothing until asked.

Turn it on with the ini option ``asynclock_fixtures = true`` or the flag
``--asynclock-fixtures``: the fixture ``locks`` (an isolated ``memory://``
client that fails the test if it leaves a lease held or an acquire waiting)
is then there for every test. Without either, a test module or a conftest.py
that imports it (``from asynclock.testing import locks``) has it too.

A test that asks for ``locks`` where it is not there fails as pytest makes
it fail ("fixture 'locks' not found"), and the plugin adds how to turn it
on to that error, and nothing else: it defines no fixture of that name that
could stand in for another plugin's.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_runtest_makereport"]

_FIXTURES = "asynclock.testing.fixtures"
#: What a test that asks for ``locks`` without it is told, after pytest's "fixture 'locks' not found".
ENABLE_HINT = (
    "asynclock's `locks` fixture is off until you turn it on: add `asynclock_fixtures = true` to"
    " [tool.pytest.ini_options] in pyproject.toml (or [pytest] in pytest.ini), run pytest with"
    " --asynclock-fixtures, or import it in a conftest.py: from asynclock.testing import locks"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("asynclock")
    group.addoption(
        "--asynclock-fixtures",
        action="store_true",
        default=False,
        help="provide asynclock's `locks` fixture (an isolated memory:// client) to every test",
    )
    parser.addini(
        "asynclock_fixtures",
        type="bool",
        default=False,
        help="provide asynclock's `locks` fixture (an isolated memory:// client) to every test",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("asynclock_fixtures") or config.getini("asynclock_fixtures"):
        from . import _fixtures

        if not config.pluginmanager.has_plugin(_FIXTURES):
            config.pluginmanager.register(_fixtures, _FIXTURES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test that asks for ``locks`` while it is off: pytest's error, then how to turn it on."""
    outcome = yield
    failure = call.excinfo.value if call.excinfo is not None and call.when == "setup" else None
    if not (isinstance(failure, pytest.FixtureLookupError) and failure.argname == "locks" and failure.msg is None):
        return
    if item.config.pluginmanager.has_plugin(_FIXTURES):
        return  # on, and yet not found: not what the hint is about
    report = outcome.get_result()
    longrepr = report.longrepr
    if isinstance(getattr(longrepr, "errorstring", None), str):
        # right under pytest's "fixture 'locks' not found", before its list of the fixtures there are
        first, _, rest = longrepr.errorstring.partition("\n")
        longrepr.errorstring = f"{first}\n{ENABLE_HINT}" + (f"\n{rest}" if rest else "")
    else:
        report.sections.append(("asynclock", ENABLE_HINT))
