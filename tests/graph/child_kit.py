"""Shared kit for child-run tests: a parent graph whose tool starts a child run, on one ledger."""

from __future__ import annotations

import itertools
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters import child_run_tool
from fencepost.adapters.child_run import ChildRunResult
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy.keys import run_account
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import CAPS
from tests.unhurried import UNHURRIED_SECONDS

DELEGATE = "agents:delegate"
PARENT_CAPS = CAPS | {DELEGATE, "admin"}
ABSTAIN = fp.AbstainProposal(reason="insufficient_evidence")


def parent_context(seconds: float = UNHURRIED_SECONDS) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities=PARENT_CAPS),
        deadline=fp.Deadline.after(seconds),
    )


def child_call(n: int) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"child-call-{n}",
        tool_name="research",
        arguments={"question": f"what broke checkout, part {n}?"},
    )


class Greedy:
    """A child model that never stops asking for tools: ``width`` fresh pings per step."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._ids = itertools.count()

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.ToolBatch:
        calls = []
        for _ in range(self.width):
            n = next(self._ids)
            calls.append(
                fp.ToolProposal(call_id=f"ping-{n:06d}", tool_name="ping", arguments={"n": n})
            )
        return fp.ToolBatch(calls=tuple(calls))


@tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=UNHURRIED_SECONDS)
def ping(n: int, ctx: fp.ToolContext) -> dict[str, int]:
    """Ping."""
    return {"n": n}


def answer_after(tool_name: str, calls: int) -> Any:
    """A child model: ``calls`` steps calling ``tool_name``, then an answer citing the last."""

    def decide(inp: fp.DecisionInput) -> Any:
        if len(inp.observations) >= calls:
            return fp.FinalProposal(
                answer=fp.AnswerPayload(
                    text="deploy 42 broke checkout", citations=(inp.observations[-1].call_id,)
                )
            )
        return fp.ToolProposal(
            call_id=f"{tool_name}-{len(inp.observations):04d}", tool_name=tool_name, arguments={}
        )

    return decide


class Family:
    """One ledger; a child graph and a parent graph whose only tool starts the child."""

    def __init__(
        self,
        child_registry: fp.ToolRegistry,
        child_model: Any,
        parent_script: list[Any],
        *,
        child_budget: fp.RuntimeBudget,
        capabilities: frozenset[str] = frozenset({"logs:read"}),
        ledger: fp.Ledger | None = None,
        child_checkpointer: BaseCheckpointSaver[Any] | None = None,
        parent_checkpointer: BaseCheckpointSaver[Any] | None = None,
        **parent_kw: Any,
    ) -> None:
        self.ledger = ledger if ledger is not None else fp.InMemoryLedger()
        self.child = fp.build_agent_graph(child_registry, child_model, ledger=self.ledger).compile(
            checkpointer=child_checkpointer or InMemorySaver()
        )
        self.tool = child_run_tool(
            self.child,
            name="research",
            description="Ask a research sub-agent.",
            budget=child_budget,
            capability=DELEGATE,
            capabilities=capabilities,
            ledger=self.ledger,
            timeout_seconds=UNHURRIED_SECONDS,
        )
        self.parent_model = ScriptedDecisionModel(parent_script)
        self.parent = fp.build_agent_graph(
            fp.ToolRegistry([self.tool]), self.parent_model, ledger=self.ledger, **parent_kw
        ).compile(checkpointer=parent_checkpointer or InMemorySaver())

    def child_results(self, state: fp.AgentState) -> list[ChildRunResult]:
        return [
            ChildRunResult.model_validate(o.result)
            for o in state.observations
            if o.tool_name == "research" and o.kind == "tool_result"
        ]

    def child_state(self, thread_id: str) -> dict[str, Any]:
        return dict(self.child.get_state({"configurable": {"thread_id": thread_id}}).values)


def parent_account(config: dict[str, Any], state: fp.AgentState) -> str:
    return run_account(config["configurable"]["thread_id"], state.run_id)
