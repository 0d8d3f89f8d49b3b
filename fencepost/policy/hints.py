"""What to do about a stop: one sentence per safe code a newcomer meets first.

A stop's code (``answer_margin``, ``tool_calls_exhausted``, ``missing_context``...) is exact but
terse. The stop report, ``fencepost show`` and the chat view's ending message add the sentence
here: what happened, and the setting or call that changes it. Derived from the code alone, so it
holds no model, tool or caller text.
"""

from __future__ import annotations

__all__ = ["HINTS", "what_to_do"]

HINTS: dict[str, str] = {
    "steps_exhausted": (
        "the run used all its model steps: give it more with "
        "fp.start(question, fp.RuntimeBudget(steps_remaining=..., tool_calls_remaining=...))"
    ),
    "tool_calls_exhausted": (
        "the run used all its tool calls: give it more with "
        "fp.start(question, fp.RuntimeBudget(tool_calls_remaining=..., steps_remaining=...))"
    ),
    "tokens_exhausted": (
        "the run used its model tokens: raise RuntimeBudget(tokens_remaining=...) in fp.start"
    ),
    "cost_exhausted": "the run spent its cost budget: raise RuntimeBudget(cost_remaining=...)",
    "money_exhausted": (
        "the run (or an account funding it) spent its money: raise "
        "RuntimeBudget(money_remaining=...), or the money limit of the account it names"
    ),
    "money_unpriced": (
        "the run has a money limit but the graph has no price for its model: pass "
        "price=fp.ModelPrice(input=..., output=...) or a model name in fp.PRICES to create_agent"
    ),
    "mutations_exhausted": (
        "the run made all the writes it was allowed: raise RuntimeBudget(mutations_remaining=...)"
    ),
    "answer_margin": (
        "the model asked for a tool in the last step, which is kept for answering "
        "(answer_margin=1): give the run more steps_remaining, or pass answer_margin=0 to "
        "create_agent / build_agent_graph"
    ),
    "missing_context": (
        "no trusted context was given, so this run ended (resuming it returns the same ending): "
        "send new input, or start a new thread, with context=fp.RunContext(tenant_id=..., "
        "principal=fp.Principal(id=..., capabilities={...}))"
    ),
    "invalid_context": (
        "context= must be a fp.RunContext(tenant_id=..., principal=fp.Principal(...)) or its "
        'JSON form {"tenant_id": ..., "principal": {"id": ..., "capabilities": [...]}}; '
        "injected dependencies are never sent as JSON: pass fp.RunContext(injected=...) in-process"
    ),
    "context_mismatch": (
        "this run was started for another tenant or principal, so it ended (resuming it "
        "returns the same ending): start a new run with your own fp.RunContext; a paused "
        "approval may be answered by another principal of its tenant holding approve:<capability>"
    ),
    "script_exhausted": (
        "the ScriptedDecisionModel ran out of entries before the run ended: add entries, or "
        "end the script with a FinalProposal or an AbstainProposal"
    ),
    "deadline_exceeded": (
        "the run passed its deadline: give a later one with fp.RunContext(deadline=fp.Deadline.after(...))"
    ),
    "approval_required": (
        "a write or external tool needs a human's approval: pass approval='interrupt' to pause "
        'for it, then resume with Command(resume="approve")'
    ),
    "approval_pending": (
        'the run waits for a human: resume it with Command(resume="approve") or "reject" '
        "(or an edit), passing the requester's context or that of a principal of its tenant "
        "holding approve:<the tool's capability>"
    ),
    "schema_violation": (
        "the model's tool call did not match the tool's argument schema and no repair was "
        "left: pass repair_attempts=N (default 1) to create_agent / build_agent_graph to show "
        "the model the problem (field paths, never values) and let it try again"
    ),
    "unknown_tool": (
        "the model called a tool that is not in the registry and no repair was left: pass "
        "repair_attempts=N (default 1) to create_agent / build_agent_graph to show the model "
        "the catalog again, or register the tool"
    ),
    "semantic_violation": (
        "a tool's rule refused the model's arguments and no repair was left: pass "
        "repair_attempts=N (default 1) to create_agent / build_agent_graph to show the model the "
        "rule and let it try again"
    ),
    "no_progress": (
        "the model repeated the same call with the same result: raise repeat_limit, or let the "
        "tool declare poll_interval_seconds if repeating it is polling"
    ),
}
"""Safe code -> the one sentence that says what to do about it."""


def what_to_do(code: str | None) -> str | None:
    """The sentence for ``code``, or ``None`` for a code with none (or no code)."""
    return HINTS.get(code) if code else None
