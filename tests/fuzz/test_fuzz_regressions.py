"""What the fuzz suite found, shrunk to its minimal form, as regression tests (their inputs are
back in the strategies). One still open upstream is a known limit (``tests/test_known_limits.py``),
its input left out of the strategies (``tests/fuzz/hostile.py`` says where).

A decision model is user code just as a tool is: whatever it raises must end the run typed
(invariant 1: nothing escapes invoke), as a tool's ``BaseException`` already does.

The model runs as a task of its own, as a tool does: whatever it
raises, its own ``CancelledError`` included, is the step's failure; only the caller's own
cancellation propagates.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fencepost as fp
from tests.graph.kit import budget, context, harness, thread


class Boom(BaseException):
    """A BaseException no handler expects."""


def _raising(exc: BaseException) -> Any:
    def model_step(inp: fp.DecisionInput) -> Any:
        raise exc

    return model_step


def _run(exc: BaseException, mode: str) -> fp.AgentState:
    h = harness([_raising(exc)])
    inp, config, ctx = fp.start("q", budget()), thread(), context()
    try:
        if mode == "sync":
            out = h.graph.invoke(inp, config, context=ctx)
        else:
            out = asyncio.run(h.graph.ainvoke(inp, config, context=ctx))
    except BaseException as escaped:
        # Turned into a failure: a KeyboardInterrupt or SystemExit would stop pytest itself.
        raise AssertionError(f"{type(escaped).__name__} escaped") from escaped
    return fp.run_output(out)


@pytest.mark.parametrize(
    "exc", [SystemExit("x"), KeyboardInterrupt("x")], ids=lambda e: type(e).__name__
)
def test_a_model_raising_system_exit_or_keyboard_interrupt_ends_typed_under_invoke(
    exc: BaseException,
) -> None:
    state = _run(exc, "sync")
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "internal_error"


@pytest.mark.parametrize(
    "exc",
    [SystemExit("x"), KeyboardInterrupt("x"), asyncio.CancelledError("x")],
    ids=lambda e: type(e).__name__,
)
def test_a_model_raising_system_exit_or_keyboard_interrupt_ends_typed_under_ainvoke(
    exc: BaseException,
) -> None:
    state = _run(exc, "async")
    assert state.termination is fp.TerminationReason.FAILED


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "exc",
    [GeneratorExit("x"), Boom("x"), BaseExceptionGroup("x", [Boom("x")])],
    ids=["GeneratorExit", "Boom", "BaseExceptionGroup"],
)
def test_a_model_raising_any_other_base_exception_ends_typed(exc: BaseException, mode: str) -> None:
    state = _run(exc, mode)
    assert state.termination is fp.TerminationReason.FAILED


def test_a_model_raising_cancelled_error_itself_ends_typed_under_invoke() -> None:
    state = _run(asyncio.CancelledError("x"), "sync")
    assert state.is_terminal
