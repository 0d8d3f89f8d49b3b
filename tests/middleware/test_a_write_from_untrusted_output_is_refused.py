"""The provenance rule in the middleware binding: a write whose sensitive argument traces only
to an untrusted tool's output (as the thread's tool messages hold it) is refused
``untrusted_provenance`` under ``provenance="refuse"``, and never runs; under the default
``"observe"`` it goes on to the usual approval."""

from __future__ import annotations

import pytest

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, budget, call, chat, ctx, lc_tools, thread

FOUND = "payments-gateway timeout"


def _run(ran: Ran, **settings: object) -> dict[str, object]:
    search, write = lc_tools(ran)
    specs = [
        fp.tool(search, effect="read", capability="logs:read"),
        fp.tool(write, effect="write", capability="notes:write", sensitive=("note",)),
    ]
    mw = fp.FencepostMiddleware(specs, budget=budget(), **settings)  # type: ignore[arg-type]
    model = chat(
        iter([call("search_logs", {"query": FOUND}, 1), call("write_note", {"note": FOUND}, 2)])
    )
    out: dict[str, object] = agent(model, [search, write], [mw]).invoke(
        ask(), thread(), context=ctx()
    )
    return out


def test_a_write_whose_note_traces_only_to_tool_output_is_refused_by_the_middleware() -> None:
    ran = Ran()
    out = _run(ran, provenance="refuse")
    assert ran.bodies == [f"search_logs:{FOUND}"]
    assert out["termination"] == fp.TerminationReason.POLICY_DENIED.value
    assert out["last_error_code"] == "untrusted_provenance"


def test_under_observe_the_middleware_lets_the_same_write_go_on_to_its_approval() -> None:
    ran = Ran()
    out = _run(ran)
    assert out["termination"] == fp.TerminationReason.APPROVAL_REQUIRED.value


def test_the_middlewares_provenance_setting_is_checked() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.FencepostMiddleware([], provenance="sometimes")  # type: ignore[arg-type]
    assert raised.value.field == "provenance"
