"""One run as an AgentDojo pipeline element, so AgentDojo's own code loads the environment,
injects the attack, and scores the run with its own utility and security checks
(``TaskSuite.run_task_with_pipeline``).

:class:`FencepostPipeline` runs the replay through a fencepost graph under a policy;
:class:`CeilingPipeline` runs the same replay straight on AgentDojo's runtime, with nothing in
between: what the replay can reach at all, the ceiling every policy is measured against.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import EmptyEnv, Env, Function, FunctionCall, FunctionsRuntime
from agentdojo.types import (
    ChatAssistantMessage,
    ChatMessage,
    ChatToolResultMessage,
    ChatUserMessage,
    text_content_block_from_string,
)

from .policies import Policy, declarations, provenance_app_data
from .replay import CurrentReplay, ReplayModel, ReplayScript
from .tools import Executed, injected, suite_registry
from .trusted import trusted_context


@dataclass
class _Compiled:
    """A graph compiled once for a suite and a policy; its runs go one at a time (the replay
    model plays the run now going), each injecting its own environment."""

    model: CurrentReplay
    saver: InMemorySaver
    graph: Any
    runs: int = 0


_COMPILED: dict[tuple[str, str], _Compiled] = {}


def _compiled(suite_name: str, policy: Policy, functions: Sequence[Function]) -> _Compiled:
    key = (suite_name, policy.name)
    found = _COMPILED.get(key)
    if found is None:
        registry = suite_registry(
            suite_name,
            functions,
            policy.guards.get(suite_name, {}),
            declarations(suite_name) if policy.base.provenance else None,
        )
        model = CurrentReplay()
        saver = InMemorySaver()
        graph = fp.build_agent_graph(registry, model, **policy.build_options(suite_name)).compile(
            checkpointer=saver
        )
        found = _COMPILED[key] = _Compiled(model, saver, graph)
    return found


@dataclass
class RunFacts:
    """What one run did, beside AgentDojo's two booleans."""

    termination: str = ""
    """The fencepost terminal reason (``replayed`` for the ceiling run)."""
    injected: bool = False
    """Whether the victim saw the injection."""
    proposed: int = 0
    executed: int = 0
    refusals: list[tuple[str, str]] = field(default_factory=list)
    """(tool, verdict code) of each refused call: capability denials, rejections, gate refusals."""
    rejected_by_approver: list[str] = field(default_factory=list)
    """The tools whose calls the approver rejected."""
    denied_as_data: int = 0
    """Calls denied and observed (the run went on), the approver's rejections included."""
    denied_call_ids: list[str] = field(default_factory=list)
    """Call ids fencepost receipted ``denied`` (never to run)."""
    ran_call_ids: list[str] = field(default_factory=list)
    """Call ids of the calls that actually ran (from the tools' own record)."""
    ran_tools: list[str] = field(default_factory=list)
    """The tools that actually ran, in order."""
    user_calls_run: int = 0
    user_calls_planned: int = 0
    elapsed_ms: float = 0.0
    """Wall time of the run (the pipeline's query), environment loading and scoring left out."""
    cpu_ms: float = 0.0
    """CPU time of the process over the run, all threads: what a loaded machine inflates less."""


def _messages(
    query: str, executed: Executed, answer: str, messages: Sequence[ChatMessage]
) -> list[ChatMessage]:
    """The conversation AgentDojo scores: one assistant call and one tool result per call that
    actually ran (its function-call trace), then the answer."""
    out: list[ChatMessage] = [*messages]
    if not any(m["role"] == "user" for m in out):
        out.append(ChatUserMessage(role="user", content=[text_content_block_from_string(query)]))
    for call, result, error in zip(executed.calls, executed.results, executed.errors, strict=True):
        out.append(
            ChatAssistantMessage(
                role="assistant", content=[text_content_block_from_string("")], tool_calls=[call]
            )
        )
        out.append(
            ChatToolResultMessage(
                role="tool",
                content=[text_content_block_from_string(result)],
                tool_call=call,
                tool_call_id=call.id,
                error=error,
            )
        )
    # Never None: AgentDojo runs the task again (up to three times) for an answer of None.
    out.append(
        ChatAssistantMessage(
            role="assistant", content=[text_content_block_from_string(answer)], tool_calls=None
        )
    )
    return out


def _user_calls_run(
    script: ReplayScript, executed: Executed, functions: Mapping[str, Function]
) -> int:
    """How many of the user task's ground-truth calls ran, each call compared with its
    parameters' defaults filled in (a tool body sees every argument, defaults included; the
    ground truth names only those it sets)."""

    def key(call: FunctionCall) -> tuple[str, dict[str, Any]]:
        function = functions.get(call.function)
        defaults = (
            {
                name: info.default
                for name, info in function.parameters.model_fields.items()
                if not info.is_required()
            }
            if function is not None
            else {}
        )
        return call.function, {**defaults, **dict(call.args)}

    remaining = [key(c) for c in script.user_calls]
    count = 0
    for call in executed.calls:
        found = key(call)
        if found in remaining:
            remaining.remove(found)
            count += 1
    return count


class FencepostPipeline(BasePipelineElement):
    """The replay through a fencepost graph, under ``policy``."""

    name = "fencepost"

    def __init__(
        self,
        suite_name: str,
        user_task: BaseUserTask[Any],
        injection_task: BaseInjectionTask[Any] | None,
        policy: Policy,
    ) -> None:
        self.suite_name = suite_name
        self.user_task = user_task
        self.injection_task = injection_task
        self.policy = policy
        self.facts = RunFacts()

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),  # noqa: B008 - AgentDojo's own signature
        messages: Sequence[ChatMessage] = (),
        extra_args: dict[str, Any] = {},  # noqa: B006 - AgentDojo's own signature
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict[str, Any]]:
        started, cpu = time.perf_counter(), time.process_time()
        policy, suite_name = self.policy, self.suite_name
        script = ReplayScript(self.user_task, self.injection_task, env)
        # The trusted context is what the application holds before the run starts: the user's
        # request and its own records, never anything a tool returns during the run.
        app_data = (
            provenance_app_data(suite_name, query, env)
            if policy.base.app_data == "provenance"
            else trusted_context(suite_name, query, env).app_data()
        )
        executed = Executed()
        functions = list(runtime.functions.values())
        compiled = _compiled(suite_name, policy, functions)
        context = fp.RunContext(
            tenant_id="agentdojo",
            principal=fp.Principal(
                id="user", capabilities=policy.grants(suite_name, [f.name for f in functions])
            ),
            app_data=app_data,
            injected=injected(env, executed),
        )
        compiled.runs += 1
        thread_id = f"run-{compiled.runs}"
        config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
        budget = fp.RuntimeBudget(
            steps_remaining=script.planned + 4, tool_calls_remaining=script.planned + 2
        )
        compiled.model.current = ReplayModel(script)
        try:
            out = compiled.graph.invoke(fp.start(query, budget), config, context=context)
        finally:
            compiled.model.current = None
            compiled.saver.delete_thread(thread_id)
        if "__interrupt__" in out:
            raise RuntimeError("a run paused: no approver here asks for a human")
        state = fp.run_output(out)
        answer = state.final_answer.text if state.final_answer is not None else ""
        self.facts = RunFacts(
            termination=state.termination.value if state.termination else "paused",
            injected=script.injected,
            proposed=len(script.proposed),
            executed=len(executed.calls),
            refusals=[
                (m.tool_name or "", m.verdict.value)
                for m in state.manifests
                if m.verdict is not None
                and m.verdict
                not in (fp.policy.VerdictCode.ALLOWED, fp.policy.VerdictCode.APPROVAL_PENDING)
            ],
            rejected_by_approver=[
                r.tool_name
                for r in fp.current_receipts(state.receipts)
                if r.approval == "approver" and r.status is fp.ReceiptStatus.DENIED
            ],
            denied_call_ids=[
                r.call_id
                for r in fp.current_receipts(state.receipts)
                if r.status is fp.ReceiptStatus.DENIED
            ],
            ran_call_ids=[c.id or "" for c in executed.calls],
            ran_tools=[c.function for c in executed.calls],
            denied_as_data=sum(
                r.status is fp.ReceiptStatus.DENIED and r.attempts == 0 and r.rule is not None
                for r in fp.current_receipts(state.receipts)
            ),
            user_calls_run=_user_calls_run(script, executed, runtime.functions),
            user_calls_planned=len(script.user_calls),
            elapsed_ms=(time.perf_counter() - started) * 1000,
            cpu_ms=(time.process_time() - cpu) * 1000,
        )
        return query, runtime, env, _messages(query, executed, answer, messages), extra_args


class CeilingPipeline(BasePipelineElement):
    """The same replay with nothing in between: every call runs on AgentDojo's runtime."""

    name = "ceiling"

    def __init__(
        self,
        suite_name: str,
        user_task: BaseUserTask[Any],
        injection_task: BaseInjectionTask[Any] | None,
    ) -> None:
        self.suite_name = suite_name
        self.user_task = user_task
        self.injection_task = injection_task
        self.facts = RunFacts()

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),  # noqa: B008 - AgentDojo's own signature
        messages: Sequence[ChatMessage] = (),
        extra_args: dict[str, Any] = {},  # noqa: B006 - AgentDojo's own signature
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict[str, Any]]:
        started, cpu = time.perf_counter(), time.process_time()
        script = ReplayScript(self.user_task, self.injection_task, env)
        executed = Executed()
        while (call := script.next_call()) is not None:
            result, error = runtime.run_function(env, call.function, dict(call.args))
            text = "" if error is not None else tool_result_to_str(result)
            executed.calls.append(FunctionCall(function=call.function, args=dict(call.args)))
            executed.results.append(text)
            executed.errors.append(error)
            script.saw([text])
        self.facts = RunFacts(
            termination="replayed",
            injected=script.injected,
            proposed=len(script.proposed),
            executed=len(executed.calls),
            user_calls_run=_user_calls_run(script, executed, runtime.functions),
            user_calls_planned=len(script.user_calls),
            elapsed_ms=(time.perf_counter() - started) * 1000,
            cpu_ms=(time.process_time() - cpu) * 1000,
        )
        return (
            query,
            runtime,
            env,
            _messages(query, executed, script.answer(), messages),
            extra_args,
        )
