"""DESIGN.md invariants 1-9, pinned where a mutation probe found no test that noticed.

Each test here was written against a deliberately broken copy of ``fencepost/graph`` and
``fencepost/policy`` (the rule named in the test removed) and fails there; it passes on the real
code. All run on a real compiled graph with an InMemorySaver.

State edits. A caller can edit a thread's state between supersteps in two ways: ``update_state``
(the routers run as if the node named by ``as_node`` had written it) and an input
``Command(update=..., goto=...)``. The executor is the last line: whatever an edit wrote, it runs a
call only for an "allowed" verdict with the same call id and argument fingerprint, for a principal
who holds the capability now, a write only where something could have approved it, and never
twice for one call id. Both forms are tried wherever it matters.

Some of these began as strict xfails for bugs the review found (a state edit through
``update_state`` ended every run; the executor dropped a refused call silently and treated any write
as approved in terminate mode; integers past 64 bits raised out of ``invoke``); those are fixed and
the tests now pin the fixes.
"""

from __future__ import annotations

from typing import TypedDict

from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from tests.graph.kit import (
    ABSTAIN,
    budget,
    call,
    context,
    harness,
    thread,
)

# -- invariant 2: the executor re-checks what it runs ---------------------------------------------


def test_executor_rechecks_the_capability_with_the_context_it_runs_under() -> None:
    # The gate allowed the call; the principal lost the capability before it ran (same identity,
    # so the context guard passes): the executor's own authorization must refuse it.
    h = harness([call(n=1), ABSTAIN])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    revoked = context(caps=frozenset({"notes:write"}))
    h.graph.invoke(None, config, context=revoked)
    assert h.calls.log == []


# -- state edits in interrupt mode cannot make a denied write run ---------------------------------


def test_an_edit_that_is_not_a_valid_proposal_never_runs_the_original_arguments() -> None:
    # NaN is not JSON: the edited proposal cannot even be built. That must never fall back to
    # the arguments the human was editing away from: the edit is asked again.
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    edit = {"decision": "edit", "arguments": {"note": float("nan")}}
    out = h.graph.invoke(Command(resume=edit), config, context=ctx)
    assert h.calls.log == []
    (asked,) = out["__interrupt__"]
    assert asked.value["error"]["code"] == "invalid_arguments"


# -- invariant 1: model output and tool output that no checkpoint can hold -----------------------


# -- invariant 5: trusted context, never from arguments --------------------------------------------


class CustomerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant_id: str
    principal_id: str


# -- invariant 7: repeats are counted once per allowed call ---------------------------------------


# -- invariant 3: an attempted call is charged, never refunded ------------------------------------


# -- invariant 8: results joined by call id --------------------------------------------------------


# -- nesting: the fencepost graph inside a user's own StateGraph ----------------------------------


class Outer(TypedDict, total=False):
    question: str
    reason: fp.TerminationReason
    answer: str
    steps_used: int
