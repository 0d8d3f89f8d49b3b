"""Known limits: every rule fencepost breaks today, as a strict xfail naming what it breaks.

Each test here states a rule of DESIGN.md that does not hold yet, in the form it will take once it
does; its docstring names the invariant it breaks and why it is not fixed. ``strict=True``: the day
a limit is lifted, its test passes, the suite fails, and the test moves to the file of the rule it
pins. No strict xfail lives anywhere else (the last test checks that).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import Receipt, ReceiptStatus
from fencepost.policy.outcome import RunReport
from tests.adapters import fakes
from tests.adapters.fakes import ToolLog, ai_call, arun, build, decider, langchain_registry
from tests.features.test_dependent_calls import ON_UPLOAD, UPLOAD, upload_registry
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    budget,
    call,
    context,
    drive_editing,
    final_citing_all,
    harness,
    thread,
)
from tests.invariants.test_7_repeats_end_as_no_progress import bump_evidence, same_search

TESTS = Path(__file__).parent

MIDDLEWARE_LIMITS: dict[str, str] = {
    "test_a_model_call_whose_argument_key_has_no_utf8_form_is_an_invalid_proposal": (
        "test_a_model_call_with_an_argument_key_of_no_utf8_form_ends_typed_in_the_middleware"
    ),
    "test_after_a_resume_without_context_the_requester_can_still_answer": (
        "test_after_a_resume_without_context_the_middleware_run_still_takes_its_requesters_answer"
    ),
}
"""Invariant tests of ``tests/invariants`` (run over both bindings) that the middleware binding
cannot pass, each mapped to the strict xfail here that runs it on that binding: the
``binding`` parameter leaves the middleware out of the invariant test itself."""


@pytest.mark.xfail(
    strict=True,
    reason="LangGraph 1.2.24 (pregel/_loop.py, PregelLoop._first) reads `resume_is_map`, bound "
    "only when Command.resume is not None: Command(resume=None) raises UnboundLocalError out of "
    "invoke and stream before any node runs",
)
def test_a_bare_none_resume_answer_does_not_escape_invoke() -> None:
    """Invariant 1 (every path ends in exactly one TerminationReason; nothing escapes
    ``invoke``). A caller answering an approval with ``Command(resume=None)`` gets an
    ``UnboundLocalError`` out of ``invoke``. Not fencepost's code: LangGraph raises before any
    node of the graph runs, so no node can turn it into a reason; the fuzz strategies leave
    this input out until LangGraph binds the name (``tests/fuzz/hostile.py``)."""
    h = harness([call("write_note", 1, note="hi")], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    out = h.graph.invoke(Command(resume=None), config, context=ctx)
    assert h.calls.count("write_note") == 0
    assert "__interrupt__" in out or fp.run_output(out).is_terminal


def _no_progress_limit() -> int:
    """How many times the repeated search runs before ``no_progress`` when nobody edits state."""
    h = harness([*same_search(10), ABSTAIN])
    state = h.run(steps=12, tools=10)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    return h.calls.count("search_logs")


@pytest.mark.xfail(
    strict=True,
    reason="the evidence map is a latest-value field (any write replaces an entry) and repeats "
    "are counted under the epoch stored there: a caller writing '<epoch+1>:...' between steps "
    "starts a fresh count every step",
)
def test_rewriting_evidence_in_state_does_not_reset_the_no_progress_count() -> None:
    """Invariant 7 (repeated proposals past a limit end as ``no_progress``). A caller holding the
    thread's config who moves the repeated call's evidence to a new epoch between steps
    (``update_state``) resets its repeat count each time: the same call with the same result
    never ends ``no_progress``. The run is still bounded by its tool budget
    (``test_rewriting_evidence_in_state_never_spends_past_the_tool_budget``, invariant 7's
    file). Not fixed yet: the fix changes how repeats are counted in ``fencepost/graph`` and
    ``fencepost/policy`` (let only the executor advance an epoch, e.g. a reducer keeping the
    highest epoch and ignoring writes without the run's sealed digest; or count repeats per
    fingerprint and result digest in the grow-only repeat counts), not something a test can do.
    """
    limit = _no_progress_limit()
    h = harness([*same_search(10), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=12, tools=10)), config, context=ctx, interrupt_after=["execute"]
    )
    state = drive_editing(h, config, ctx, bump_evidence)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert h.calls.count("search_logs") == limit


@pytest.mark.xfail(
    strict=True,
    reason="the decider's rendered-turn cache hands the chat model the same message objects at "
    "every step of a run, so an edit made in place to one is shown again at the next step",
)
@pytest.mark.parametrize("window", [None, 3])
def test_an_in_place_edit_of_a_shown_message_does_not_reach_the_runs_next_step(
    window: int | None,
) -> None:
    """DESIGN, "The state": what a step is shown is rebuilt from the run's record (no numbered
    invariant covers the model's input as such). An integration or callback that marks the last
    message it is handed, in place (a prompt-caching breakpoint, as Anthropic-style caching
    does), finds the mark again at the next step on a message that is no longer last; the marks
    pile up step after step (Anthropic refuses more than four), while a run resumed in a fresh
    process is shown none. Not fixed: handing out copies costs O(shown) per step where the cache
    exists to make a step cost the window; which to give up is the maintainers' trade-off."""
    marked: list[int] = []

    def step(n: int) -> Any:
        def reply(messages: list[BaseMessage]) -> AIMessage:
            marked.append(sum("cache_control" in m.additional_kwargs for m in messages))
            messages[-1].additional_kwargs["cache_control"] = {"type": "ephemeral"}
            if n < 6:
                return ai_call("search_logs", {"query": f"q{n}"}, f"call_{n:04d}")
            return fakes.final_citing_all(messages)

        return reply

    model, _ = decider([step(n) for n in range(7)], history_window=window)
    state = asyncio.run(arun(build(langchain_registry(ToolLog()), model), steps=8, tools=6))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert marked == [0] * 7


# -- every strict xfail is here, and says what it breaks ------------------------------------------


def _xfail_marks(tree: ast.AST) -> list[ast.expr]:
    """Every ``xfail`` a module applies: ``pytest.mark.xfail(...)``, a bare ``pytest.mark.xfail``
    (as a decorator or in ``pytest.param(marks=...)``), and ``pytest.xfail(...)``; each as the
    call that applies it, or the bare attribute."""
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return [
        called.get(id(n), n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "xfail"
    ]


@pytest.mark.xfail(
    strict=True,
    reason="earlier_outputs reads a dependency's first observation in state, and a caller's "
    "write appends any observation that validates, so one written while the run waits before "
    "the call runs (an approval, interrupt_before) is read as the call's result. Fix: the "
    "ledger's result mark (keys.result_key) carries a digest of the result the executor "
    "recorded, and earlier_outputs takes the observation that matches it (a ledger key format "
    "change, with a migration)",
)
def test_a_dependent_reads_the_result_its_dependency_returned_not_one_a_caller_planted(
    ledger: fp.Ledger,
) -> None:
    """Invariant 8 (results are joined to proposals by call id, never by arrival order) and the
    dependent-calls feature (a call reads its dependency's *verified* output). A caller who
    appends an observation for a call while the run waits before it runs has it read as that
    call's result by a dependent. Not fixed: the ledger's result mark would have to carry a
    digest of the result (a key format change, with a migration)."""
    seen: list[dict[str, Any]] = []
    h = harness(
        [UPLOAD, ON_UPLOAD, final_citing_all], registry=upload_registry(seen), ledger=ledger
    )
    config, ctx = thread(), context(caps=DOCS)
    request = fp.start("upload", budget(steps=5, tools=4))
    h.graph.invoke(request, config, context=ctx, interrupt_before=["execute"])
    planted = fp.policy.Observation(
        sequence=0,
        call_id=UPLOAD.call_id,
        tool_name="upload_document",
        kind="tool_result",
        result={"task_id": "planted-by-the-caller", "detail": {}},
    )
    h.graph.invoke(Command(update={"run": {"observations": (planted,)}}), config, context=ctx)
    assert seen == [{"call-0001": {"task_id": "task-17", "detail": {}}}]


@pytest.mark.xfail(
    strict=True,
    reason="LangChain composes wrap_tool_call first-listed outermost and shows no middleware the "
    "list: a retry wrapper listed after FencepostMiddleware calls the tool itself, inside it",
)
def test_a_retry_wrapper_listed_inside_fencepost_middleware_runs_a_failing_write_once() -> None:
    """Invariant 9 (a write runs at most once per call id), in the middleware binding.
    ``ToolRetryMiddleware`` listed after ``FencepostMiddleware`` is inside its
    ``wrap_tool_call``: the retries call the tool under fencepost's one admission. Not fixed:
    the list is not visible to a middleware, so the middleware cannot refuse it;
    ``fp.check_middleware`` refuses such a list when the caller checks it before
    ``create_agent`` (``docs/middleware.md``, "Its place in the list: last")."""
    from tests.middleware.test_place_in_the_middleware_list import _failing_write_run

    ran, _ = _failing_write_run("fencepost_first")
    assert len(ran.bodies) == 1


@pytest.mark.xfail(
    strict=True,
    reason="SummarizationMiddleware calls its own model inside before_model, which no hook of "
    "FencepostMiddleware wraps: its calls are not model steps of the budget",
)
def test_model_calls_other_middleware_make_are_reserved_as_steps() -> None:
    """Invariant 3 (reserve before the call: a model step is reserved before the model is
    called), in the middleware binding. The summarizer's model calls are made by another
    middleware on its own, unseen. Not fixed: LangChain offers no hook around a model call
    another middleware makes (``docs/middleware.md``, "What it cannot see")."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import HumanMessage

    from tests.middleware.kit import Ran, agent, budget, chat, ctx, lc_tools, search_forever, specs
    from tests.middleware.kit import thread as mw_thread

    ran = Ran()
    tools = lc_tools(ran)
    summarizer = chat(iter([AIMessage("summary")] * 50))
    summarize = SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 2))
    model = chat(search_forever())
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(steps=4, tools=50))
    agent(model, tools, [summarize, mw]).invoke(
        {"messages": [HumanMessage("why?")]}, mw_thread(), context=ctx()
    )
    assert len(model.received) + len(summarizer.received) <= 4


@pytest.mark.xfail(
    strict=True,
    reason="create_agent checkpoints the model's AIMessage in its model node, before any hook of "
    "FencepostMiddleware sees it: an argument key with a lone surrogate fails that write "
    "(msgpack refuses it) and escapes invoke",
)
def test_a_model_call_with_an_argument_key_of_no_utf8_form_ends_typed_in_the_middleware() -> None:
    """Invariant 1 (every path ends in exactly one TerminationReason; nothing escapes
    ``invoke``), in the middleware binding. A tool call whose argument *key* has no UTF-8 form
    ends the graph binding ``invalid_proposal`` (``unrepresentable_arguments``); in
    ``create_agent`` the checkpoint of the model's own message raises first. Not fixed: the
    message is written by LangChain's model node; only a ``wrap_model_call`` that rewrites the
    model's reply could refuse it (``docs/middleware.md``, "What it cannot see")."""
    from tests.invariants.bindings import MiddlewareBinding
    from tests.invariants.test_1_text_with_no_utf8_form_ends_typed import (
        test_a_model_call_whose_argument_key_has_no_utf8_form_is_an_invalid_proposal as limit,
    )

    limit(MiddlewareBinding)


@pytest.mark.xfail(
    strict=True,
    reason="FencepostMiddleware ends a run whose resume carries no context (or another identity) "
    "policy_denied, where the graph binding keeps waiting for the right answer",
)
def test_after_a_resume_without_context_the_middleware_run_still_takes_its_requesters_answer() -> (
    None
):
    """Invariant 5 (on resume the caller must pass the context again) and DESIGN, "Approvals
    and provenance" (a resume that is wrong in any way changes nothing; the right person can
    still answer), in the middleware binding: a resume with no context ends the run
    ``policy_denied``; the requester's own answer after it finds the run ended. Nothing runs
    either way. Not fixed: the middleware does not take answers by another principal yet
    (``approval_right``), and its approval waits inside ``after_model``, which ends the run
    instead of asking again (``docs/middleware.md``, "The settings")."""
    from tests.invariants.bindings import MiddlewareBinding
    from tests.invariants.test_5_trusted_context_comes_from_the_caller import (
        test_after_a_resume_without_context_the_requester_can_still_answer as limit,
    )

    limit(MiddlewareBinding)


@pytest.mark.xfail(
    strict=True,
    reason="FencepostMiddleware's termination is a plain state field of create_agent's graph: "
    "update_state rewrites it after the run ended, and no hook runs again to restore it",
)
def test_a_caller_never_rewrites_an_ended_middleware_run_to_completed() -> None:
    """Invariant 1 (a terminal state refuses further transitions) and DESIGN, "Isolation" (the
    terminal status is enforced from the ledger, which ``update_state`` cannot reach), in the
    middleware binding: ``update_state(config, {"termination": "completed"})`` on a run that
    ended ``tool_budget_exhausted`` makes the thread's state say ``completed`` (its record,
    ``fencepost_run``, and the ledger's closed account still say how it ended), and
    ``invoke(None)`` runs no hook that could restore it. Not fixed: the graph binding refuses
    such a write in its compiled graph's command checks (``graph.compiled``); the middleware
    has no hook on a state update, and a channel's reducer cannot tell the hook's write from
    the caller's."""
    from tests.middleware.kit import (
        Ran,
        agent,
        ask,
        budget,
        chat,
        ctx,
        lc_tools,
        search_forever,
        specs,
        thread,
    )

    tools = lc_tools(Ran())
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=3, tools=1))
    graph, config = agent(chat(search_forever()), tools, [guard]), thread()
    assert graph.invoke(ask(), config, context=ctx())["termination"] == "tool_budget_exhausted"
    graph.update_state(config, {"termination": "completed", "last_error_code": None})
    out = graph.invoke(None, config, context=ctx())
    assert out["termination"] == "tool_budget_exhausted"


@pytest.mark.xfail(
    strict=True,
    reason="the stalled shared model loop is replaced only for calls it has not started: a call "
    "already awaiting its provider there when another run's model blocks the loop's thread is "
    "held until that model returns, or until its own deadline",
)
def test_a_model_call_in_flight_when_another_blocks_the_shared_loop_is_not_held_by_it() -> None:
    """DESIGN, "Isolation: runs, tenants, callers" (a blocked worker cannot starve healthy work;
    one run's callable cannot hurt another run), invariant 1 (the model is asked within its
    deadline). A sync run's model call has started on the shared model loop and awaits its
    provider; another tenant's model then blocks the loop's thread inside ``async def``. The
    stall is seen only by calls not started yet (``run_model_blocking`` waits on ``started``):
    the call in flight, whose answer needs the loop to turn, waits out its whole deadline and
    its run ends ``timeout``. Not fixed: its caller would have to notice the stall while it
    waits (a ping the loop must answer within ``STALL_SECONDS``) and ask the model again on the
    replacing loop, a second request for the step already reserved (its first one's tokens are
    never reported); or the sync graph calls the model's sync API, with no shared loop."""
    import threading

    from fencepost.graph.containment.model import ModelRun, run_model_blocking

    blocker_in, release = threading.Event(), threading.Event()

    async def in_flight() -> str:
        # Its provider answers once the other model holds the loop; hearing it needs the loop.
        await asyncio.to_thread(blocker_in.wait, 30)
        return "in flight"

    async def blocking() -> str:
        blocker_in.set()
        release.wait(30)  # a blocking client: the loop's thread waits, nothing yields
        return "blocked"

    runs: list[ModelRun] = []
    waiting = threading.Thread(target=lambda: runs.append(run_model_blocking(in_flight, 5)))
    waiting.start()
    other = threading.Thread(target=lambda: run_model_blocking(blocking, 60))
    other.start()
    try:
        waiting.join(30)
    finally:
        release.set()
        other.join(30)
    assert [(r.finished, r.value) for r in runs] == [(True, "in flight")]


@pytest.mark.xfail(
    strict=True,
    reason="each model call that blocks its thread for good holds a loop of its own: the loop "
    "that replaces a stalled one is replaced in turn when the next such call blocks it, with no "
    "bound on the loops (and threads) held",
)
def test_model_calls_that_never_return_hold_a_bounded_number_of_threads() -> None:
    """DESIGN, "Isolation: runs, tenants, callers" (a blocked or leaked worker cannot starve
    healthy work, nor hurt the process). Three model calls in a row that block their thread
    inside ``async def`` for good (a hung blocking client), each past its deadline before the
    next: each next call finds the shared loop stalled and replaces it, and the replacement is
    held in turn, so three calls hold three ``fencepost-models`` threads, N calls N threads,
    until their models return: the tool pool bounds such threads per tenant and per process
    (``tool_threads``), the shared model loop does not. Not fixed: bound the loops held by
    retired stalled loops (a ``HELD_LOOPS`` cap, past which a stalled loop is not replaced and
    a call waits for it, or fails ``unavailable`` at once as a tool that finds its share full
    of bodies left behind does), and know whose model blocked one (the call's tenant) so that
    one tenant cannot spend the cap. The bound asserted here: the hung calls hold at most two
    of them."""
    import threading

    from fencepost.graph.containment.model import run_model_blocking
    from fencepost.graph.containment.shared_loop import STALL_SECONDS

    release = threading.Event()
    holding: set[threading.Thread] = set()

    async def hung() -> str:
        holding.add(threading.current_thread())
        release.wait(60)
        return "late"

    try:
        for _ in range(3):
            before = len(holding)
            # On a loaded machine a call can be cut off before its model ever started (its
            # task is cancelled unrun and holds nothing): ask again, a bounded number of times,
            # until this call's model holds a thread of its own.
            for _attempt in range(10):
                assert not run_model_blocking(hung, STALL_SECONDS * 1.5).finished
                if len(holding) > before:
                    break
        held = sum(1 for t in holding if t.is_alive())
    finally:
        release.set()
    assert held <= 2


def _paused_for_u1() -> tuple[Any, dict[str, Any], fp.RunContext, fp.RunContext]:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, owner, intruder = thread(), context(principal="u-1"), context(principal="u-2")
    h.graph.invoke(fp.start("q", budget()), config, context=owner)
    return h, config, owner, intruder


def _the_owner_can_still_answer(h: Any, config: dict[str, Any], owner: fp.RunContext) -> None:
    out = h.graph.invoke(Command(resume="approve"), config, context=owner)
    assert h.calls.count("write_note") == 1
    ended = fp.run_output(out)
    assert ended.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert ended.principal_id == "u-1" and ended.last_error_code is None


@pytest.mark.xfail(
    strict=True,
    reason="LangGraph saves a Command's update before the approve node judges its answer: only "
    "an update rewriting tenant_id/principal_id is refused first (compiled.py); one writing "
    "run_id, stop or phase stays and ends the run at the owner's answer",
)
@pytest.mark.parametrize(
    "write",
    [{"run_id": "run-mine-now"}, {"stop": {"reason": "cancelled"}}, {"phase": "terminal"}],
    ids=["run_id", "stop", "phase"],
)
def test_a_refused_answer_changes_nothing_whatever_its_update_writes(
    write: dict[str, Any],
) -> None:
    """DESIGN, "Approvals and provenance" (a resume that is wrong in any way changes nothing;
    the right person can still answer). An intruder's refused answer whose update writes the
    run's id (the owner's answer then ends ``account_conflict``), a stop (the run ends
    ``cancelled``, though ``fp.cancel`` would refuse this caller) or the terminal phase
    (``invalid_state``) still ends the owner's run. Not fixed: the fix is to judge the answer
    (``may_answer`` against the ledger's owner) before LangGraph saves anything, or to refuse
    any record write sent with an answer that changes a value; both change what the caller-value
    tests pin about updates sent with answers."""
    h, config, owner, intruder = _paused_for_u1()
    before = h.graph.get_state(config)
    with contextlib.suppress(fp.CommandRefused):
        h.graph.invoke(Command(resume="approve", update={"run": write}), config, context=intruder)
    assert h.calls.count("write_note") == 0
    assert h.graph.get_state(config).values["run"] == before.values["run"]
    _the_owner_can_still_answer(h, config, owner)


@pytest.mark.xfail(
    strict=True,
    reason="a caller's write of the run record's principal_id is taken by the record's fold; the "
    "run then ends context_mismatch at its owner's next step instead of keeping its identity",
)
@pytest.mark.parametrize(
    "command",
    [
        Command(update={"run": {"principal_id": "u-2"}}),
        Command(goto="approve", update={"run": {"principal_id": "u-2"}}),
    ],
    ids=["update-alone", "goto-the-waiting-node"],
)
def test_a_command_without_an_answer_cannot_change_whose_run_it_is(command: Command[Any]) -> None:
    """Invariant 5 (the identity bound to a thread at start cannot be changed by any state
    update), read strictly: today the rewrite never acts (the run ends ``policy_denied``,
    ``context_mismatch``, at the owner's next step, and the ledger's owner still refuses the
    intruder), but the record keeps the intruder's principal and the owner loses the run.
    Not fixed: the fix (the record's fold ignoring a caller's write of ``tenant_id``,
    ``principal_id`` and ``run_id`` once the run has started) changes what the isolation and
    caller-value tests pin about such writes."""
    h, config, owner, intruder = _paused_for_u1()
    with contextlib.suppress(fp.CommandRefused):
        h.graph.invoke(command, config, context=intruder)
    assert h.graph.get_state(config).values["run"]["principal_id"] == "u-1"
    _the_owner_can_still_answer(h, config, owner)


class _ChildGaveUp(RunReport):
    note: str = "the child ran out of budget"


@pytest.mark.xfail(
    strict=True,
    reason="the ledger marks a call whose tool returned as having produced a result, incomplete "
    "or not: only the latest receipt in state keeps an incomplete run report uncitable, and a "
    "caller can append a later completed one",
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_forged_completed_receipt_never_makes_an_incomplete_run_report_citable(how: str) -> None:
    """DESIGN (seed 002): work is done, and an answer supported, only by what a tool of this run
    produced, as the ledger's records show, never by a receipt a caller wrote into state. A
    child run that reported ``completed=False`` is receipted ``failed``/``incomplete``; a
    forged later ``completed`` receipt makes it citable and the run ends ``completed``.
    Not fixed: writing no result marker for an incomplete outcome changes what a dependent call may
    wait on (a design decision); the marker could instead record the outcome's status."""
    h = harness(
        [
            call("search_logs", 1),
            call("write_note", 2, note="a"),
            fp.FinalProposal(answer=fp.AnswerPayload(text="done", citations=("call-0001",))),
            ABSTAIN,
        ],
        approval="interrupt",
        search_result=_ChildGaveUp(completed=False),
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    forged = {
        "run": {
            "receipts": [
                Receipt(
                    call_id="call-0001", tool_name="search_logs", status=ReceiptStatus.COMPLETED
                )
            ]
        }
    }
    if how == "command":
        out = h.graph.invoke(Command(resume="approve", update=forged), config, context=ctx)
    else:
        h.graph.update_state(config, forged)
        out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = fp.run_output(out)
    assert state.termination is not fp.TerminationReason.COMPLETED
    assert state.last_error_code == "unsupported_citation"


def test_every_middleware_limit_names_a_strict_xfail_here() -> None:
    tree = ast.parse(Path(__file__).read_text())
    xfails = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef) and _xfail_marks(node)
    }
    assert set(MIDDLEWARE_LIMITS.values()) <= xfails
    invariants = "".join(p.read_text() for p in (TESTS / "invariants").glob("test_*.py"))
    assert all(f"def {name}(" in invariants for name in MIDDLEWARE_LIMITS)


def test_no_test_outside_this_module_is_an_xfail() -> None:
    elsewhere = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__) and _xfail_marks(ast.parse(path.read_text()))
    ]
    assert elsewhere == [], "a known limit belongs in tests/test_known_limits.py"


def test_every_known_limit_is_strict_and_names_the_design_rule_it_breaks() -> None:
    tree = ast.parse(Path(__file__).read_text())
    marks = {
        node.name: [d for d in node.decorator_list if d in _xfail_marks(node)]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
    limits = {name: found for name, found in marks.items() if found}
    assert len(limits) == 14
    for name, (mark,) in limits.items():
        assert isinstance(mark, ast.Call), name
        strict = {k.arg: k.value for k in mark.keywords}.get("strict")
        assert isinstance(strict, ast.Constant) and strict.value is True, name
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        doc = ast.get_docstring(node) or ""
        assert "Invariant" in doc or "DESIGN" in doc, name
        assert "Not fixed" in doc or "Not fencepost's code" in doc, name
