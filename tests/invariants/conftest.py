"""The ``binding`` fixture: each binding of the contract in turn (``bindings.py``)."""

from __future__ import annotations

import pytest

from tests.invariants.bindings import BINDINGS, Binding


@pytest.fixture(params=list(BINDINGS))
def binding(request: pytest.FixtureRequest) -> type[Binding]:
    """Each binding of the contract in turn: fencepost's graph, create_agent + middleware."""
    return BINDINGS[request.param]
