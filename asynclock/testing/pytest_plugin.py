"""asynclock's pytest plugin: pytest loads it (entry point ``pytest11``), and it does
nothing until asked.

Turn it on with the ini option ``asynclock_fixtures = true`` or the flag
``--asynclock-fixtures``: the fixture ``locks`` (an isolated ``memory://``
client that fails the test if it leaves a lease held or an acquire waiting)
is then there for every test. Without either, a test module or a conftest.py
that imports it (``from asynclock.testing import locks``) has it too.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_addoption", "pytest_configure"]

_FIXTURES = "asynclock.testing.fixtures"


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
