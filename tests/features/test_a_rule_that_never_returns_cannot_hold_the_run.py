"""A tool's own rule that never returns cannot hold the run: its ``semantic_validator`` (in
every form: two arguments, the run's context, ``provenance=``) or its ``progress_predicate`` is
left behind at the rule's limit (``RULE_TIMEOUT_SECONDS``) or the run's deadline, whichever is
sooner, and the call fails closed — a validator that did not answer refuses the call
``rule_timeout``, a predicate that did not answer has shown no progress. Over both bindings
(fencepost's graph and ``create_agent`` with ``fp.FencepostMiddleware``), sync and async.

Each blocked rule waits for an event the test sets only after the run ended: the run ending
while the rule is still blocked is what shows it was not waited for."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_core.tools import tool as lc_tool

import fencepost as fp
import fencepost.graph.rules
from fencepost.policy import (
    DEFAULT_REPEAT_LIMIT,
    NoProgressDetected,
    ToolSemanticError,
    VerdictCode,
    check_progress,
    check_semantics,
    gate_proposal,
    proposal_fingerprint,
)
from fencepost.policy.progress import repeat_key
from fencepost.policy.rule_runner import RULE_TIMEOUT, RuleTimedOut
from tests.invariants import bindings as bd
from tests.middleware import kit as mw
from tests.policy.factories import SearchArgs, make_proposal, make_spec, make_state

FOREVER = 60.0
"""How long a blocked rule waits for its release: far past any limit here, so that, without
containment, the run would end only after the rule gave up (and the tests would fail)."""

BINDINGS = [
    pytest.param(bd.GraphBinding, "invoke", id="graph-sync"),
    pytest.param(bd.GraphBinding, "ainvoke", id="graph-async"),
    pytest.param(bd.MiddlewareBinding, "invoke", id="middleware-sync"),
    pytest.param(bd.MiddlewareBinding, "ainvoke", id="middleware-async"),
]


class Blocked:
    """A rule that blocks until released; records whether it was entered and returned."""

    def __init__(self, answer: Any = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.answer = answer

    def block(self) -> Any:
        self.entered.set()
        self.release.wait(FOREVER)
        self.returned.set()
        return self.answer


@pytest.fixture
def blocked() -> Iterator[Blocked]:
    rule = Blocked(answer=True)
    yield rule
    rule.release.set()


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough for a loaded machine to start the rule's thread: a rule never started is
    # denied too, and the test would not see it block.
    monkeypatch.setattr(fencepost.graph.rules, "RULE_TIMEOUT_SECONDS", 1.0)


LIMITS = (1.0, 4.0, 16.0)
"""The rule's limits (``RULE_TIMEOUT_SECONDS``) a run is tried with, in turn, until its rule is
entered: the limit also covers getting the rule a thread and reaching it, and a busy machine may
not do that within a small one (the rule, never started, is denied all the same, but the test
would not see it block). Each is far below :data:`FOREVER`."""


@pytest.fixture
def entered_rule(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[Callable[[Callable[[Blocked], bd.Outcome]], tuple[Blocked, bd.Outcome]]]:
    """Runs ``start`` (a run whose rule blocks on the :class:`Blocked` it is given) with each
    of :data:`LIMITS` until the rule was entered; returns that rule and the run's outcome, with
    only that run's ``fencepost`` warnings in ``caplog``. Every rule is released at the end."""
    rules: list[Blocked] = []

    def run(start: Callable[[Blocked], bd.Outcome]) -> tuple[Blocked, bd.Outcome]:
        for limit in LIMITS:
            monkeypatch.setattr(fencepost.graph.rules, "RULE_TIMEOUT_SECONDS", limit)
            rule = Blocked(answer=True)
            rules.append(rule)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="fencepost"):
                out = start(rule)
            if rule.entered.is_set():
                break
        return rule, out

    yield run
    for rule in rules:
        rule.release.set()


def _probe() -> Any:
    @lc_tool
    def probe(query: str) -> str:
        """Probe the service."""
        return f"probed {query}"

    return probe


def _validators(rule: Blocked) -> dict[str, Callable[..., None]]:
    def two(args: Any, state: Any) -> None:
        rule.block()

    def with_context(args: Any, state: Any, context: Any) -> None:
        rule.block()

    def with_provenance(args: Any, state: Any, *, provenance: Any) -> None:
        rule.block()

    return {"two": two, "context": with_context, "provenance": with_provenance}


@pytest.mark.parametrize(("binding", "mode"), BINDINGS)
@pytest.mark.parametrize("form", ["two", "context", "provenance"])
def test_a_validator_that_never_returns_refuses_the_call_rule_timeout(
    caplog: pytest.LogCaptureFixture,
    entered_rule: Callable[[Callable[[Blocked], bd.Outcome]], tuple[Blocked, bd.Outcome]],
    binding: type[bd.Binding],
    mode: str,
    form: str,
) -> None:
    probe = _probe()

    def start(rule: Blocked) -> bd.Outcome:
        declared = {**bd.READ, "semantic_validator": _validators(rule)[form]}
        b = binding(
            bd.then_answer(bd.call("probe", {"query": "x"}, 1)),
            steps=4,
            tools=2,
            extra_tools=[(probe, declared)],
            mode=mode,
        )
        return b.start(mw.ctx())

    blocked, out = entered_rule(start)
    assert blocked.entered.is_set()
    assert not blocked.returned.is_set()  # the run ended while the rule still blocked
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.INVALID_PROPOSAL.value,
        "semantic_violation",
    )
    timed_out = [r for r in caplog.records if getattr(r, "code", None) == "rule_timeout"]
    assert timed_out and all(r.name.startswith("fencepost") for r in timed_out)


@pytest.mark.usefixtures("small_limit")
@pytest.mark.parametrize(("binding", "mode"), BINDINGS)
def test_a_validator_that_never_returns_is_a_repeat_when_denials_are_observed(
    blocked: Blocked, binding: type[bd.Binding], mode: str
) -> None:
    # Observed, the refusal is shown to the model as a refused argument and the run goes on.
    probe = _probe()
    declared = {**bd.READ, "semantic_validator": _validators(blocked)["two"]}
    b = binding(
        bd.then_answer(bd.call("probe", {"query": "x"}, 1)),
        steps=4,
        tools=2,
        extra_tools=[(probe, declared)],
        mode=mode,
        denial="observe",
    )
    out = b.start(mw.ctx())
    assert not blocked.returned.is_set()
    assert out.termination == fp.TerminationReason.COMPLETED.value
    shown = [m for m in out.received[-1] if getattr(m, "tool_call_id", None) == "call-0001"]
    assert "invalid_argument" in repr(shown)


@pytest.mark.parametrize(("binding", "mode"), BINDINGS)
def test_a_validator_that_never_returns_is_left_behind_at_the_runs_deadline(
    blocked: Blocked, binding: type[bd.Binding], mode: str
) -> None:
    # The rule's own limit (RULE_TIMEOUT_SECONDS, not patched here) is longer than what is left
    # of the run: the run's deadline cuts the wait.
    probe = _probe()
    declared = {**bd.READ, "semantic_validator": _validators(blocked)["two"]}
    b = binding(
        bd.then_answer(bd.call("probe", {"query": "x"}, 1)),
        steps=4,
        tools=2,
        extra_tools=[(probe, declared)],
        mode=mode,
    )
    assert fencepost.graph.rules.RULE_TIMEOUT_SECONDS > 2
    out = b.start(mw.ctx().model_copy(update={"deadline": fp.Deadline.after(2)}))
    assert not blocked.returned.is_set()
    assert out.termination is not None
    assert out.bodies == []


@pytest.mark.parametrize(("binding", "mode"), BINDINGS)
def test_a_progress_predicate_that_never_returns_has_shown_no_progress(
    caplog: pytest.LogCaptureFixture,
    entered_rule: Callable[[Callable[[Blocked], bd.Outcome]], tuple[Blocked, bd.Outcome]],
    binding: type[bd.Binding],
    mode: str,
) -> None:
    probe = _probe()

    def start(rule: Blocked) -> bd.Outcome:
        def progressed(proposal: Any, state: Any) -> bool:
            return bool(rule.block())  # would answer True (progress), had it answered in time

        declared = {**bd.READ, "progress_predicate": progressed}
        same = [bd.call("probe", {"query": "x"}, n) for n in range(1, 5)]
        b = binding(
            bd.then_answer(*same), steps=8, tools=8, extra_tools=[(probe, declared)], mode=mode
        )
        return b.start(mw.ctx())

    blocked, out = entered_rule(start)
    assert blocked.entered.is_set()
    assert not blocked.returned.is_set()
    assert out.termination == fp.TerminationReason.NO_PROGRESS.value
    assert any(getattr(r, "code", None) == "rule_timeout" for r in caplog.records)


@pytest.mark.parametrize(("binding", "mode"), BINDINGS)
def test_a_validator_raising_system_exit_on_its_thread_is_still_contained(
    caplog: pytest.LogCaptureFixture, binding: type[bd.Binding], mode: str
) -> None:
    def exits(args: Any, state: Any) -> None:
        raise SystemExit(mw.SECRET)

    probe = _probe()
    b = binding(
        bd.then_answer(bd.call("probe", {"query": "x"}, 1)),
        steps=4,
        tools=2,
        extra_tools=[(probe, {**bd.READ, "semantic_validator": exits})],
        mode=mode,
        denial="observe",
    )
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        out = b.start(mw.ctx())
    assert out.termination == fp.TerminationReason.COMPLETED.value
    shown = [m for m in out.received[-1] if getattr(m, "tool_call_id", None) == "call-0001"]
    assert "invalid_argument" in repr(shown)
    assert any(getattr(r, "code", None) == "validator_failed" for r in caplog.records)
    assert all(mw.SECRET not in repr(m) for turn in out.received for m in turn)


def _gave_up(rule: Callable[[], Any], /) -> Any:
    """A runner that did not hear back from the rule in time (the rule is never called)."""
    raise RuleTimedOut


def test_the_gates_refuse_a_call_whose_validator_the_runner_gave_up_on() -> None:
    spec = make_spec(semantic_validator=lambda args, state: None)
    with pytest.raises(ToolSemanticError) as refused:
        check_semantics(spec, SearchArgs(query="x"), make_state(), run_rule=_gave_up)
    assert refused.value.rule == RULE_TIMEOUT
    verdict = gate_proposal(
        fp.ToolRegistry([spec]),
        make_proposal({"query": "x"}),
        make_state(),
        fp.Principal(id="user-1", capabilities=frozenset({"logs:read"})),
        run_rule=_gave_up,
    )
    assert (verdict.code, verdict.problems) == (
        VerdictCode.SEMANTIC_VIOLATION,
        (f"rule: {RULE_TIMEOUT}",),
    )


def test_the_gates_count_a_predicate_the_runner_gave_up_on_as_no_progress() -> None:
    spec = make_spec(progress_predicate=lambda proposal, state: True)
    proposal = make_proposal({"query": "x"})
    key = repeat_key(proposal_fingerprint(proposal.tool_name, proposal.arguments), make_state())
    state = make_state(fingerprints={key: DEFAULT_REPEAT_LIMIT})
    assert check_progress(spec, proposal, state) == key  # answered: progress
    with pytest.raises(NoProgressDetected):
        check_progress(spec, proposal, state, run_rule=_gave_up)
