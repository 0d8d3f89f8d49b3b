"""Invariant 1, for text with no UTF-8 form: every run ends typed, and every checkpoint is written.

A lone surrogate (``"\\ud800"``) is valid JSON (``json.loads('"\\\\ud800"')``), so any provider's
tool-call arguments and any page a tool fetches may hold one; a prompt-injected page can make a
model echo it. No checkpoint stores it as it is (LangGraph's serializer writes ``?`` for it in a
value and refuses it in a key) and UTF-8 hashing raises on it. So:

- arguments holding one (in a value or a key, at any depth) are an invalid proposal,
  ``unrepresentable_arguments``: refused before anything is fingerprinted, reserved or run;
- a tool result holding one is kept as data, each such character shown as U+FFFD: the run goes
  on, and the body never runs again;
- an approval's edited arguments holding one are asked again, as any edit no checkpoint holds;
- a caller's write to the run record holding one (`update_state`, `Command(update=...)`) is
  taken as a value no checkpoint holds: it never escapes, and the run ends typed.

A final answer, an abstention, a call id or a context field holding one is refused by pydantic
(a ``str`` field takes no lone surrogate), and ``app_data`` is never written: the fuzz suite
(``tests/fuzz``) draws them all.

Each on an ``InMemorySaver``, a ``SqliteSaver`` on a file and a ``PostgresSaver``, under
``LANGGRAPH_STRICT_MSGPACK=true`` as ``make test`` runs.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: a model's call
holding such text in an argument value or key (the key is a middleware limit). The other tests
drive the graph's own state, nodes or settings (``update_state``, ``Command(update=...)``,
channels, ``interrupt_before``, repair, the approver, token estimates, savers and ledgers by URL),
which the middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import open_checkpointer
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import ai_call, fake_model
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    harness,
    make_registry,
    paused_for_approval,
    thread,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw
from tests.strategies import any_text, has_unencodable_text, json_tree, unencodable_text

ODD = "\ud800"
"""A lone surrogate, as ``json.loads('"\\\\ud800"')`` gives it."""
REPLACED = "\ufffd"

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemorySaver()
    elif request.param == "sqlite":
        conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
        yield SqliteSaver(conn)
        conn.close()
    else:
        with open_checkpointer(request.getfixturevalue("postgres_schema")) as pg:
            yield pg


def _reread(graph: Any, config: dict[str, Any]) -> fp.AgentState:
    """The thread's state as its checkpoint holds it (what a new process would read)."""
    return fp.run_output(graph.get_state(config).values)


_leaf = st.none() | st.booleans() | st.integers(-5, 5) | any_text(max_size=6)


@st.composite
def arguments_holding_a_lone_surrogate(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments with a lone surrogate somewhere: the query, a key, or deep in a value."""
    odd = draw(unencodable_text(max_size=8))
    where = draw(st.sampled_from(["query", "key", "deep"]))
    if where == "query":
        return {"query": odd}
    if where == "key":
        return {"query": "checkout", odd: draw(_leaf)}
    tree = draw(json_tree(_leaf, max_leaves=4, keys=any_text(max_size=4)))
    return {"query": "checkout", "extra": [tree, {"k": odd}]}


@SETTINGS
@given(arguments=arguments_holding_a_lone_surrogate(), via=st.sampled_from(["chat", "scripted"]))
def test_arguments_holding_text_with_no_utf8_form_are_an_invalid_proposal(
    saver: Any, arguments: dict[str, Any], via: str
) -> None:
    calls = Calls()
    if via == "chat":
        model: Any = ChatModelDecider(fake_model([ai_call("search_logs", arguments, "call-0001")]))
    else:
        model = ScriptedDecisionModel(
            [fp.ToolProposal(call_id="call-0001", tool_name="search_logs", arguments=arguments)]
        )
    graph = fp.build_agent_graph(make_registry(calls), model).compile(checkpointer=saver)
    config, ctx = thread(), context()
    state = fp.run_output(graph.invoke(fp.start("q", budget()), config, context=ctx))
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "unrepresentable_arguments"
    assert calls.log == [] and state.budget.tool_calls_used == 0
    assert _reread(graph, config) == state
    # The finished thread stays finished, readable, with nothing run.
    assert fp.run_output(graph.invoke(None, config, context=ctx)) == state
    assert calls.log == []


@SETTINGS
@given(
    result=st.builds(
        lambda odd, extra: {"page": odd, odd: [odd, extra]},
        unencodable_text(max_size=10),
        json_tree(_leaf, max_leaves=3, keys=any_text(max_size=4)),
    )
)
def test_a_tool_result_holding_text_with_no_utf8_form_is_kept_as_data_and_never_run_again(
    saver: Any, result: Any
) -> None:
    h = harness([call(), final_citing_last], search_result=result, checkpointer=saver)
    config, ctx = thread(), context()
    state = h.run(config=config, ctx=ctx)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1
    (observation,) = state.observations
    assert observation.kind == "tool_result"
    assert not has_unencodable_text(observation.result)
    assert REPLACED in observation.result["page"]  # type: ignore[index, call-overload]
    assert _reread(h.graph, config) == state
    # Invoked again, the finished thread neither raises nor runs the body again.
    assert fp.run_output(h.graph.invoke(None, config, context=ctx)) == state
    assert h.calls.count("search_logs") == 1


def test_the_model_is_shown_the_result_with_each_such_character_replaced(saver: Any) -> None:
    seen: list[Any] = []

    def look(inp: fp.DecisionInput) -> Any:
        seen.append(inp.observations[-1].result)
        return ABSTAIN

    h = harness([call(), look], search_result={"hits": ["a" + ODD + "b"]}, checkpointer=saver)
    state = h.run()
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert seen == [{"hits": ["a" + REPLACED + "b"]}]


@pytest.mark.parametrize(
    "arguments", [{"note": "a" + ODD}, {"note" + ODD: "a"}], ids=["value", "key"]
)
def test_an_edit_holding_text_with_no_utf8_form_is_asked_again_and_the_right_answer_runs(
    saver: Any, arguments: dict[str, Any]
) -> None:
    h, config, ctx = paused_for_approval(checkpointer=saver)
    h.graph.invoke(
        Command(resume={"decision": "edit", "arguments": arguments}), config, context=ctx
    )
    assert h.graph.get_state(config).next == ("approve",)
    assert h.calls.count("write_note") == 0
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [args for name, args, _ in h.calls.log if name == "write_note"] == [{"note": "a"}]
    assert _reread(h.graph, config) == state


@pytest.mark.parametrize(
    "write",
    [{"fingerprints": {"key" + ODD: 1}}, {"answered": {"call" + ODD: 1}}],
    ids=["fingerprints", "answered"],
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_record_write_holding_text_with_no_utf8_form_never_escapes_and_the_run_ends_typed(
    saver: Any, write: dict[str, Any], how: str
) -> None:
    h, config, ctx = paused_for_approval(checkpointer=saver)
    if how == "command":
        h.graph.invoke(Command(update={"run": write}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"run": write}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)
        if h.graph.get_state(config).next == ("approve",):
            h.graph.invoke(Command(resume="approve"), config, context=ctx)
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.termination is not None
    assert h.calls.count("write_note") <= 1


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def _refused_before_anything_runs(binding: type[bd.Binding], arguments: dict[str, Any]) -> None:
    b = binding(bd.then_answer(bd.call("search_logs", arguments, 1)), steps=4, tools=4)
    out = b.start(mw.ctx())
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.INVALID_PROPOSAL.value,
        "unrepresentable_arguments",
    )
    assert out.bodies == [] and b.reservation("call-0001") is None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=unencodable_text(max_size=8), deep=st.booleans())
def test_a_model_call_whose_argument_value_has_no_utf8_form_is_an_invalid_proposal(
    binding: type[bd.Binding], odd: str, deep: bool
) -> None:
    arguments = {"query": "checkout", "extra": [{"k": odd}]} if deep else {"query": odd}
    _refused_before_anything_runs(binding, arguments)


def test_a_model_call_whose_argument_key_has_no_utf8_form_is_an_invalid_proposal(
    binding: type[bd.Binding],
) -> None:
    arguments = {"query": "checkout", ODD: None}
    _refused_before_anything_runs(binding, arguments)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=unencodable_text(max_size=8))
def test_a_question_holding_text_with_no_utf8_form_is_answered(
    binding: type[bd.Binding], odd: str
) -> None:
    # The user's request is read as a decoder shows such text: the run goes on with it.
    b = binding(bd.then_answer(bd.call("search_logs", {"query": "checkout"}, 1)), steps=4, tools=4)
    out = b.start(mw.ctx(), question=f"why is {odd} failing?")
    assert (out.termination, out.error_code) == (fp.TerminationReason.COMPLETED.value, None)
    assert len(out.bodies) == 1
