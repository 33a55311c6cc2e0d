"""The contract every backend keeps (API.md), run once per backend.

The tests themselves are ``asynclock.testing.conformance.Contract``, the
suite a backend written elsewhere runs against itself too. Here it runs on
every backend of the project: the ``harness`` fixture (tests/conftest.py,
one ``tests/harnesses`` harness per backend in ``BACKENDS``) gives each
test a fresh key prefix and checks afterwards that nothing was left behind
on the server.
"""

from __future__ import annotations

from asynclock.testing.conformance import Contract


class TestContract(Contract):
    """The conformance suite on every backend of ``tests.conftest.BACKENDS``."""
