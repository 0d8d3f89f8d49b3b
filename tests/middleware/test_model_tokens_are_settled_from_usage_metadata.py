"""Token settlement in the middleware binding, as in the graph binding: each model step holds a
bounded estimate before the model is called and is settled against the usage the model reported
(``AIMessage.usage_metadata``) after; a missing or implausible report is charged a count of the
text sent and received, never nothing; usage past the hold is charged, and a limit it crosses
ends the run with a typed reason."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage

import fencepost as fp
from fencepost.policy.usage import MAX_PLAUSIBLE_TOKENS as MOST
from tests.middleware.kit import Ran, agent, ask, chat, ctx, lc_tools, specs, thread

SEARCH = {"name": "search_logs", "args": {"query": "checkout"}}


def _reply(n: int, usage: dict[str, Any] | None, *, final: bool = False) -> AIMessage:
    calls = (
        [] if final else [{**SEARCH, "args": {"query": f"checkout #{n}"}, "id": f"call-{n:04d}"}]
    )
    content = "checkout is down" if final else ""
    return AIMessage(content=content, tool_calls=calls, usage_metadata=usage)  # type: ignore[arg-type]


def _usage(tokens_in: int, tokens_out: int) -> dict[str, int]:
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": 0}


def _run(replies: list[AIMessage], tokens: int) -> dict[str, Any]:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(
        specs(tools),
        budget=fp.RuntimeBudget(
            steps_remaining=10, tool_calls_remaining=10, tokens_remaining=tokens
        ),
    )
    out: dict[str, Any] = agent(chat(iter(replies)), tools, [mw]).invoke(
        ask(), thread(), context=ctx()
    )
    return out


def test_reported_usage_is_charged_as_given_each_step() -> None:
    replies = [_reply(1, _usage(100, 20)), _reply(2, _usage(100, 20))]
    out = _run([*replies, _reply(3, _usage(100, 20), final=True)], tokens=100_000)
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    assert out["fencepost_run"]["budget"]["tokens_used"] == 360
    usage = [
        (m["input_tokens"], m["output_tokens"])
        for m in out["fencepost_manifests"]
        if m["input_tokens"] is not None
    ]
    assert usage == [(100, 20)] * 3


def test_usage_past_the_token_limit_is_charged_and_ends_the_run_naming_tokens() -> None:
    replies = [_reply(n, _usage(100, 20)) for n in range(1, 10)]
    out = _run(replies, tokens=250)
    assert out["termination"] == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert out["last_error_code"] == "tokens_exhausted"
    # Spent already: charged in full, past the limit.
    assert out["fencepost_run"]["budget"]["tokens_used"] == 360


def test_a_step_the_model_reports_nothing_for_is_charged_the_text_it_sent_and_received() -> None:
    out = _run([_reply(1, None), _reply(2, None, final=True)], tokens=100_000)
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    assert out["fencepost_run"]["budget"]["tokens_used"] > 0


counts = st.integers(min_value=-5, max_value=20_000_000)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(report=st.one_of(st.none(), st.tuples(counts, counts)))
def test_whatever_the_model_reports_a_step_is_charged_a_plausible_report_or_the_counted_text(
    report: tuple[int, int] | None,
) -> None:
    usage = None if report is None else _usage(*report)
    out = _run([_reply(1, usage, final=True)], tokens=100_000_000)
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    used = out["fencepost_run"]["budget"]["tokens_used"]
    # Plausible: counts in range, and an output of at least a token (the reply has text).
    plausible = report is not None and all(c >= 0 for c in report) and sum(report) <= MOST
    if plausible and report is not None and report[1] >= 1:
        assert used == sum(report)
    else:
        assert used >= 1  # the text sent and received, counted: never nothing
