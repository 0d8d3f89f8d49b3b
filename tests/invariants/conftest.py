"""The ``binding`` parameter: each binding of the contract in turn, less the ones a documented
limit excludes from a test (``tests/test_known_limits.py``'s ``MIDDLEWARE_LIMITS``, where the
excluded run is a strict xfail)."""

from __future__ import annotations

import pytest

from tests.invariants.bindings import BINDINGS
from tests.test_known_limits import MIDDLEWARE_LIMITS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "binding" not in metafunc.fixturenames:
        return
    excluded = {"middleware"} if metafunc.function.__name__ in MIDDLEWARE_LIMITS else set()
    names = [name for name in BINDINGS if name not in excluded]
    metafunc.parametrize("binding", [BINDINGS[n] for n in names], ids=names)
