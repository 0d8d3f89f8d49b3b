"""The trusted run context lives in the policy layer; the graph binding re-exports it and
declares the shape a caller sends it in (LangGraph's ``context_schema``)."""

# No `from __future__ import annotations`: TypedDict reads Required[...] from real annotations.
from typing import Required

from pydantic import JsonValue

# pydantic builds the published JSON schema from it, and on Python < 3.12 it accepts only
# typing_extensions' TypedDict.
from typing_extensions import TypedDict

from fencepost.policy import Deadline, Principal
from fencepost.policy.context import RunContext, coerce_context

__all__ = ["ContextInput", "RunContext", "coerce_context"]


class ContextInput(TypedDict, total=False):
    """The graph's ``context_schema``: a :class:`RunContext`, or its JSON form.

    A ``RunContext`` passed to ``invoke`` reaches the nodes as it is; a mapping (what LangGraph
    Server passes) is validated by the nodes with :func:`coerce_context`, and a missing or
    malformed one ends the run ``policy_denied`` (``missing_context``, ``invalid_context``). Declared as a
    ``TypedDict`` rather than the pydantic model because LangGraph builds a pydantic context
    schema from a mapping before any node runs, so a bad context would fail the whole run with
    a ``ValidationError`` instead of ending it with a reason. The published JSON schema is still
    this shape: ``{"tenant_id": "acme", "principal": {"id": "u-1", "capabilities": [...]},
    "deadline": {"at": "2026-01-01T00:00:00Z"}, "app_data": {...}}``; ``RunContext.injected`` is
    not in it: application objects are injected in-process, and a mapping naming ``injected``
    is refused (``invalid_context``), never taken for the application's dependencies.
    """

    tenant_id: Required[str]
    """The tenant the run acts for."""
    principal: Required[Principal]
    """Who the run acts for, and the capabilities it holds."""
    deadline: Deadline | None
    """The run's deadline (an absolute UTC instant); absent: only per-stage timeouts."""
    budget_account: str | None
    """A ledger account the run's own account is opened under."""
    app_data: dict[str, JsonValue]
    """The application's own trusted data for the run (known payees, allowed domains)."""
