"""asynclock's pytest plugin (``asynclock.testing.pytest_plugin``, loaded by the
``pytest11`` entry point) and its ``locks`` fixture, run by pytest on test
files of a user's project (``pytester``, in a subprocess of its own each).

The plugin adds the fixture only when asked (ini option, flag) or when a
module imports it; the fixture fails a test that leaves a lease held or an
acquire waiting, with a message that says which.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

#: Tests a user would write with the fixture: one clean, two leaky, one on the virtual clock.
USER_TESTS = """
import asyncio
import time

import pytest

import asynclock
from asynclock.testing import faults, virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_clean(locks):
    async with locks.lock("job") as lease:
        assert lease.token is not None
    kept = await locks.lock("job").acquire(detached=True)
    await kept.release()


async def test_leaks_a_lease(locks):
    await locks.lock("forgotten").acquire()


async def test_leaves_a_waiter(locks):
    faults(locks).unavailable()
    asyncio.create_task(locks.lock("retrying").acquire())  # retried for a ttl: still waiting at the end
    await asyncio.sleep(0.05)


async def test_a_30s_lease_is_lost_at_once(locks):
    started = time.monotonic()
    async with virtual_clock():
        with pytest.raises(asynclock.LockLost):
            async with locks.lock("slow"):
                faults(locks).stall_renewals()
                await asyncio.sleep(3600)
    assert time.monotonic() - started < 5
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # -p no:cacheprovider: nothing written next to the user's tests but what the test made
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args)


def test_the_ini_option_gives_every_test_the_fixture_and_leaks_fail(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasynclock_fixtures = true\n")
    pytester.makepyfile(test_user=USER_TESTS)
    result = run(pytester, "-rE")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_lease*",
            "*asynclock: the code under test left 1 thing(s) going on its memory:// client*"
            "lease 'forgotten' held (token *, hold count 1, owner task-*)*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaves_a_waiter*",
            "*asynclock: the code under test left 1 thing(s)*1 acquire(s) of 'retrying' still waiting*",
        ]
    )
    assert "lease 'job'" not in result.stdout.str()  # the clean test left nothing


def test_the_flag_gives_every_test_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    run(pytester, "--asynclock-fixtures", "-k", "clean or 30s").assert_outcomes(passed=2)


#: What pytest's error about a missing ``locks`` is followed by: each way the docs give to turn it on.
HINT = (
    "*asynclock's `locks` fixture is off until you turn it on: add `asynclock_fixtures = true` to"
    " [[]tool.pytest.ini_options[]] in pyproject.toml*--asynclock-fixtures*from asynclock.testing import locks"
)


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "1"]], ids=["in-process", "xdist"])
def test_without_the_option_or_an_import_there_is_no_fixture_and_the_error_says_how(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = run(pytester, "-k", "clean", *workers)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'locks' not found*", HINT])
    assert "--asynclock-fixtures" in run(pytester, "--help").stdout.str()  # the plugin is loaded, and idle


def test_the_hint_is_only_for_a_missing_locks_fixture(pytester: pytest.Pytester) -> None:
    """Another missing fixture gets pytest's error alone, and a ``locks`` fixture of the
    project's own (or another plugin's) is used as it is: the plugin defines none."""
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef locks():\n    return 'the project s own'\n")
    pytester.makepyfile(
        test_user="def test_own(locks):\n    assert locks == 'the project s own'\n\n"
        "def test_other(nothing_like_it):\n    pass\n"
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fixture 'nothing_like_it' not found*"])
    assert "asynclock_fixtures" not in result.stdout.str()


def test_importing_the_fixture_provides_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="from asynclock.testing import locks\n" + USER_TESTS)
    result = run(pytester, "-k", "clean or leaks_a_lease")
    result.assert_outcomes(passed=2, errors=1)  # the leaky test ran, and errs at its teardown
    result.stdout.fnmatch_lines(["*lease 'forgotten' held*"])


def test_a_conftest_that_imports_the_fixture_provides_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from asynclock.testing import locks  # noqa: F401\n")
    pytester.makepyfile(test_user=USER_TESTS)
    run(pytester, "-k", "clean or 30s").assert_outcomes(passed=2)


#: A backend's own test module, as its authors would write it: a harness, and the suite.
THIRD_PARTY = """
import pytest

import asynclock
from asynclock.abc import Acquired, Busy
from asynclock.backends import memory
from asynclock.testing.conformance import Contract, Harness


class EveryoneGetsIt(memory.MemoryBackend):
    \"\"\"A broken backend: an acquire of a taken lock succeeds too.\"\"\"

    async def try_acquire(self, ref, hold, ttl, *, enqueue):
        answer = await super().try_acquire(ref, hold, ttl, enqueue=enqueue)
        return Acquired(1) if isinstance(answer, Busy) else answer


class ThirdPartyHarness(Harness):
    def __init__(self, backend):
        super().__init__()
        self.backend = backend

    def open(self, **options):
        return asynclock.Locks(self.backend(prefix=options.pop("prefix")), **options)

    async def expire(self, name):
        return memory.expire(name, prefix=self.prefix)

    async def leftovers(self):
        return [key for key in memory._TABLE.held_keys() if key.startswith(self.prefix + ":")]


@pytest.fixture(params=[memory.MemoryBackend, EveryoneGetsIt], ids=["sound", "broken"])
async def harness(request):
    async with ThirdPartyHarness(request.param) as h:
        yield h


class TestThirdParty(Contract):
    pass
"""


def test_a_backend_written_elsewhere_runs_the_conformance_suite(pytester: pytest.Pytester) -> None:
    """The suite runs on a backend object passed to ``asynclock.Locks``, and fails a
    backend that lets two clients hold one lock."""
    pytester.makepyfile(test_backend=THIRD_PARTY)
    result = run(pytester, "-v", "-k", "acquire_release_and_lease_fields or exclude_each_other")
    result.assert_outcomes(passed=3, failed=1)
    for line in (
        "*TestThirdParty::test_acquire_release_and_lease_fields?sound? PASSED*",
        "*TestThirdParty::test_acquire_release_and_lease_fields?broken? PASSED*",
        "*TestThirdParty::test_two_clients_exclude_each_other_with_increasing_tokens?sound? PASSED*",
        "*TestThirdParty::test_two_clients_exclude_each_other_with_increasing_tokens?broken? FAILED*",
    ):
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(["*two holders at once*"])
