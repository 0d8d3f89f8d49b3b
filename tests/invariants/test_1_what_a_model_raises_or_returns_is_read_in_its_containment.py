"""Invariant 1 (every run ends with one typed reason; nothing escapes ``invoke``) and DESIGN,
"Isolation" (a ``BaseException`` from the model's code is contained), for what a decision model
raises or returns: an ``InvalidProposal`` whose ``code`` raises, an exception whose ``__str__``,
``__repr__``, ``status_code``, ``__class__`` or ``__notes__`` raises, a subclass of ``Decided`` or
of a decision whose attributes raise. Each is read in the model's containment (its thread or its
task), for a ``def`` and an ``async def`` model under ``invoke`` and ``ainvoke``; the run ends
``failed`` or ``invalid_proposal`` with a safe code, what the model's text says reaches no
checkpoint, and the developer log has it, written once the step's outcome counts (a model left
behind logs nothing: ``tests/graph/test_blocking_paths.py``)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.policy.stop_report import SAFE_CODE
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    make_registry,
    saver_bytes,
    thread,
)
from tests.graph.test_tool_isolation import finishes, wait_until
from tests.hostile_exceptions import READ_AS_METHOD, READ_AS_PROPERTY, hostile_exception
from tests.invariants.test_1_every_run_ends_typed import (
    assert_the_model_fails_its_run_in_containment,
)

SECRET = "password=hunter2"


class _CodeBreaksWhenRead(fp.InvalidProposal):
    """An ``InvalidProposal`` whose ``code`` raises ``SystemExit`` when the runtime reads it."""

    @property  # type: ignore[override]
    def code(self) -> str:
        raise SystemExit(f"code: {SECRET}")

    @code.setter
    def code(self, _: str) -> None:
        pass


class _DefRaisesBrokenInvalid:
    def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        raise _CodeBreaksWhenRead()


class _AsyncRaisesBrokenInvalid:
    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        raise _CodeBreaksWhenRead()


@pytest.mark.parametrize(
    "model", [_DefRaisesBrokenInvalid, _AsyncRaisesBrokenInvalid], ids=["def", "async"]
)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_invalid_proposal_a_model_raises_is_read_in_its_containment(
    model: type[Any], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert_the_model_fails_its_run_in_containment(model(), mode, caplog)


# -- scripted models: a def one and an async def one -----------------------------------------------


class _Script:
    """A ``def decide`` model: each step returns its reply or raises it; then abstains."""

    def __init__(self, *steps: object) -> None:
        self.steps = list(steps)

    def next(self) -> Any:
        step = self.steps.pop(0) if self.steps else ABSTAIN
        if isinstance(step, BaseException):
            raise step
        return step

    def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        return self.next()


class _AsyncScript(_Script):
    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:  # type: ignore[override]
        return self.next()


def _run(model: _Script, mode: str) -> tuple[fp.AgentState, InMemorySaver]:
    saver = InMemorySaver()
    graph = fp.build_agent_graph(make_registry(Calls()), model, model_retries=0).compile(
        checkpointer=saver
    )

    def run() -> Any:
        request = fp.start("q", budget())
        if mode == "invoke":
            return graph.invoke(request, thread(), context=context())
        return asyncio.run(graph.ainvoke(request, thread(), context=context()))

    return fp.run_output(finishes(run)), saver


# -- what a model raises --------------------------------------------------------------------------

_BASES: list[type[BaseException]] = [
    fp.InvalidProposal,
    RuntimeError,
    TimeoutError,
    Exception,
    SystemExit,
    KeyboardInterrupt,
    GeneratorExit,
]
_RAISES: list[type[BaseException]] = [SystemExit, KeyboardInterrupt, RuntimeError, ValueError]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    base=st.sampled_from(_BASES),
    where=st.sampled_from(READ_AS_PROPERTY + READ_AS_METHOD),
    raises=st.sampled_from(_RAISES),
    model=st.sampled_from([_Script, _AsyncScript]),
    mode=st.sampled_from(["invoke", "ainvoke"]),
)
def test_whatever_a_model_raises_ends_its_run_typed_and_is_logged_once_it_counts(
    base: type[BaseException],
    where: str,
    raises: type[BaseException],
    model: type[_Script],
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    state, saver = _run(model(hostile_exception(base, where, raises, SECRET)), mode)
    assert state.termination in (
        fp.TerminationReason.FAILED,
        fp.TerminationReason.INVALID_PROPOSAL,
    )
    assert re.fullmatch(SAFE_CODE, state.last_error_code or "")
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in repr(state)
    if state.termination is fp.TerminationReason.FAILED:
        # A failure is the developer's to see: logged once, on the model's logger.
        warned = [r for r in caplog.records if r.name == "fencepost.model" and r.levelno >= 30]
        assert len(warned) == 1


# -- what a model returns: subclasses of Decided and of the decisions -----------------------------


def _hostile_subclass(base: type[Any], target: str | None, raises: type[BaseException]) -> Any:
    """A subclass of the pydantic record ``base`` that raises ``raises`` (text: ``SECRET``)
    whenever attribute ``target`` is looked up on it (``None``: a harmless subclass)."""

    def __getattribute__(self: Any, name: str) -> Any:
        if name == target:
            raise raises(f"{name}: {SECRET}")
        return base.__getattribute__(self, name)

    return type(f"Hostile{base.__name__}", (base,), {"__getattribute__": __getattribute__})


def _reply(shape: str, target: str | None, raises: type[BaseException]) -> tuple[Any, Any]:
    """A reply of ``shape`` with one hostile subclass in it, and how the run ends when that
    subclass is harmless."""
    sub = lambda base: _hostile_subclass(base, target, raises)  # noqa: E731
    if shape == "decided":
        return sub(fp.Decided)(decision=ABSTAIN, input_tokens=5), ABSTAIN_ENDS
    if shape == "abstain":
        return sub(fp.AbstainProposal)(reason="insufficient_evidence"), ABSTAIN_ENDS
    if shape == "tool":
        return sub(fp.ToolProposal)(**call().model_dump()), ABSTAIN_ENDS
    if shape == "batch":
        return fp.ToolBatch(calls=(sub(fp.ToolProposal)(**call().model_dump()),)), ABSTAIN_ENDS
    if shape == "final":
        return sub(fp.FinalProposal)(answer=fp.AnswerPayload(text="")), COMPLETED
    answer = sub(fp.policy.observation.AnswerPayload)(text="")
    return fp.FinalProposal(answer=answer), COMPLETED


ABSTAIN_ENDS = fp.TerminationReason.INSUFFICIENT_EVIDENCE
COMPLETED = fp.TerminationReason.COMPLETED
_TARGETS = [
    None,
    "decision",
    "input_tokens",
    "generated_call_ids",
    "reason",
    "call_id",
    "tool_name",
    "arguments",
    "calls",
    "answer",
    "text",
    "citations",
    "kind",
    "model_dump",
    "__dict__",
    "__class__",
]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    shape=st.sampled_from(["decided", "abstain", "tool", "batch", "final", "answer"]),
    target=st.sampled_from(_TARGETS),
    raises=st.sampled_from(_RAISES),
    model=st.sampled_from([_Script, _AsyncScript]),
    mode=st.sampled_from(["invoke", "ainvoke"]),
)
def test_a_reply_of_subclasses_is_read_in_containment_into_the_runtimes_own_types(
    shape: str,
    target: str | None,
    raises: type[BaseException],
    model: type[_Script],
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.clear()
    try:
        reply, harmless_ending = _reply(shape, target, raises)
    except BaseException:  # a subclass that cannot even be built is no reply to test
        return
    state, saver = _run(model(reply), mode)
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in repr(state)
    if target is None:
        # A harmless subclass is read as the runtime's own record: the run ends as its base's.
        assert state.termination is harmless_ending
    else:
        assert state.termination in (
            harmless_ending,
            fp.TerminationReason.FAILED,
            fp.TerminationReason.INVALID_PROPOSAL,
        )
        assert re.fullmatch(SAFE_CODE, state.last_error_code or "internal_error")


# -- a model left behind logs nothing, whatever it raises later --------------------------------


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_def_model_left_behind_that_raises_an_unsafe_invalid_proposal_later_logs_nothing(
    mode: str, caplog: pytest.LogCaptureFixture, on_time_pool: Any
) -> None:
    # ``on_time_pool``: the first call's body has started before its step waits for it, so
    # its deadline finds it running (and leaves it behind), whatever the machine's load.
    caplog.set_level(logging.DEBUG)
    go, raised = threading.Event(), threading.Event()

    class LateInvalid:
        def __init__(self) -> None:
            self.steps = 0

        def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
            self.steps += 1
            if self.steps == 1:
                go.wait(30)  # past its deadline: the step ends timeout, it is left behind
                raised.set()
                raise fp.InvalidProposal(f"unsafe {SECRET}")
            go.set()
            raised.wait(30)
            return ABSTAIN

    saver = InMemorySaver()
    graph = fp.build_agent_graph(
        make_registry(Calls()), LateInvalid(), model_retries=1, model_timeout_seconds=1.0
    ).compile(checkpointer=saver)

    def run() -> Any:
        if mode == "invoke":
            return graph.invoke(fp.start("q", budget()), thread(), context=context())
        return asyncio.run(graph.ainvoke(fp.start("q", budget()), thread(), context=context()))

    state = fp.run_output(finishes(run, within=60))
    assert raised.is_set()
    assert [(m.outcome, m.code) for m in state.manifests if m.phase.value == "decide"] == [
        ("error", "timeout"),
        ("decided", "insufficient_evidence"),
    ]
    wait_until(lambda: on_time_pool.stats() == (0, 0))  # its late failure has been read
    assert SECRET not in caplog.text
    assert SECRET.encode() not in saver_bytes(saver)
