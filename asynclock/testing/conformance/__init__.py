"""The contract every backend keeps, as a test suite a backend runs against itself.

asynclock's own backends run it in the project's test suite; a backend
written elsewhere (see the Backend protocol in :mod:`asynclock.abc`) runs the
very same tests, the way ShedLock ships its lock-provider test kit. The
suite is the class :class:`Contract`: subclass it in a test module (its name
must start with ``Test`` for pytest to collect it) and give it a ``harness``
fixture that yields a :class:`Harness` for your backend, one per test::

    import pytest

    import asynclock
    from asynclock.testing.conformance import Contract, Harness


    class MyHarness(Harness):
        def open(self, **options):
            # ``options`` has ``prefix`` (this test's own), and maybe ``ttl`` and ``on_event``
            prefix = options.pop("prefix")
            return asynclock.Locks(MyBackend(server, prefix=prefix), **options)

        async def expire(self, name):
            ...  # delete the hold on ``name`` on the server, as an expiry would; True if there was one

        async def leftovers(self):
            ...  # what this test's prefix still has on the server: must be [] at the end


    @pytest.fixture
    async def harness():
        async with MyHarness() as h:
            yield h


    class TestMyBackend(Contract):
        pass

The tests are asyncio coroutines run by anyio's pytest plugin, which comes
with asynclock (each test is marked ``pytest.mark.anyio``). Run them with
``pytest -p anyio`` if plugins are not loaded automatically.

What a :class:`Harness` gives the tests:

* ``connect(**options)``: a new client of the backend under test, isolated
  from every other test by ``prefix``; the harness closes it at the end.
  Override :meth:`Harness.open` to make one (by default
  ``asynclock.connect(self.url, **options)``, for a backend with a URL).
* ``await expire(name)``: take the hold on ``name`` away on the server,
  without telling the client, as the server would when the lease expires.
* ``await leftovers()``: what is left on the server under this test's
  prefix (keys, nodes, rows) once every client has closed; the suite fails a
  test that leaves anything (fence counters, which must survive, aside).
* Capability flags: ``has_tokens`` (False if ``lease.token`` is always None:
  no safe fencing token, as with Redlock) and ``server_counts`` (False if the
  hold count of a re-entered lock lives in the client, so that
  ``info().hold_count`` says 1).

Times scale with the environment variable ``ASYNCLOCK_TEST_SCALE`` (``2``
doubles every ttl and time bound, for a slow machine or backend); the
tests' ttl is 0.6 s times it.

The tests live in one module per subject, and :class:`Contract` gathers
them: a hold and its lease's fields (``_holding``), contention
(``_waiting``), cancellation (``_cancelling``), a lease's renewal and loss
(``_leases``), events and closing (``_events``); the harness and the time
scale are in ``_harness``.
"""

from __future__ import annotations

import pytest

from ._cancelling import Cancelling
from ._events import EventsAndClosing
from ._harness import TTL, Harness, scaled
from ._holding import Holding
from ._leases import Leases
from ._waiting import Waiting

__all__ = ["CLIENT_TESTS", "TTL", "Contract", "Harness", "ServerContract", "scaled"]

# shown where users import it from
Harness.__module__ = __name__


# pytest runs the tests of base classes from the last base to the first
class Contract(EventsAndClosing, Leases, Cancelling, Waiting, Holding):
    """The contract tests (API.md's guarantees), for any backend: subclass it as
    ``class TestMyBackend(Contract)`` next to a ``harness`` fixture."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self) -> str:
        """asynclock runs on asyncio (anyio's plugin would try trio too, where installed)."""
        return "asyncio"


#: The tests of what the client does by itself, the same whatever serves the lock:
#: argument checks, events, the owner task and detached leases, the watchdog
#: stopped, the client closed. A backend runs them in its :class:`Contract`;
#: :class:`ServerContract` leaves them out.
CLIENT_TESTS = (
    "test_bad_arguments_raise_before_any_io",
    "test_bad_timeout_raises_before_any_io",
    "test_events_are_reported",
    "test_a_failing_event_callback_is_logged_not_raised",
    "test_timeout_via_asyncio_timeout_keeps_the_owner",
    "test_body_is_cancelled_at_its_deadline_even_if_the_watchdog_stalls",
    "test_a_hold_whose_owner_task_ended_is_abandoned_and_released_at_once",
    "test_lease_release_from_another_task_cancels_the_holders_body",
    "test_detached_lease_belongs_to_no_task_and_lives_until_released",
    "test_a_closed_client_says_so",
)


class ServerContract(Contract):
    """:class:`Contract` without its :data:`CLIENT_TESTS`: for one more primitive, or one
    more way of connecting, of a backend that already runs the whole contract."""


for _name in CLIENT_TESTS:
    assert callable(getattr(Contract, _name)), _name
    setattr(ServerContract, _name, None)
