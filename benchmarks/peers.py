"""Peers on the same tool loop: Pydantic AI and the OpenAI Agents SDK, dressed as ``System``s.

Each peer runs the same loop as the LangGraph systems: a fake model that makes one call of the
same trivial tool per turn (counted in :data:`common.TALLY`) until N, then a final text; the
framework's own limits are on (Pydantic AI ``UsageLimits``, the Agents SDK ``max_turns``).
Neither peer keeps a checkpoint: they hold the run in memory, so they are compared with the
LangGraph systems on ``InMemorySaver``.

No network: Pydantic AI's ``FunctionModel`` and a custom Agents SDK ``Model`` never reach a
provider, and the Agents SDK's tracing (which would export to OpenAI) is disabled.
"""

from __future__ import annotations

from typing import Any

from common import FINAL_TEXT, QUESTION, TALLY, TOOL_NAME, System, call_id, search_logs, tool_args


def build_pydantic_ai() -> System:
    """Pydantic AI: ``Agent(FunctionModel(...))`` with ``UsageLimits`` on requests and tool calls."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        i = TALLY.turn()
        if i is None:
            return ModelResponse(parts=[TextPart(FINAL_TEXT)])
        return ModelResponse(
            parts=[ToolCallPart(tool_name=TOOL_NAME, args=tool_args(i), tool_call_id=call_id(i))]
        )

    agent = Agent(FunctionModel(model, model_name="bench-tool-loop"), name="bench")
    agent.tool_plain(name=TOOL_NAME)(search_logs)

    class Runner:
        checkpointer = None

        @staticmethod
        def _limits(n: int) -> UsageLimits:
            return UsageLimits(request_limit=n + 5, tool_calls_limit=n + 5)

        def invoke(self, n: int, config: Any, **kw: Any) -> Any:
            return agent.run_sync(QUESTION, usage_limits=self._limits(n))

        async def ainvoke(self, n: int, config: Any, **kw: Any) -> Any:
            return await agent.run(QUESTION, usage_limits=self._limits(n))

    def check(out: Any, n: int) -> str | None:
        return None if out.output == FINAL_TEXT else f"ended with output {out.output!r:.60}"

    return System(name="pydantic_ai", graph=Runner(), make_input=lambda n: n, check=check)


def build_openai_agents() -> System:
    """The OpenAI Agents SDK: ``Agent`` with a custom ``Model`` returning tool calls, and
    ``Runner.run(..., max_turns=N+5)``. Tracing disabled (no export to a tracing endpoint)."""
    from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    class ToolLoopModel(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            i = TALLY.turn()
            output: list[Any]
            if i is None:
                output = [
                    ResponseOutputMessage(
                        id="msg-final",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text=FINAL_TEXT, annotations=[])
                        ],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc-{i:06d}",
                        call_id=call_id(i),
                        name=TOOL_NAME,
                        arguments=f'{{"query": "{tool_args(i)["query"]}"}}',
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark does not stream")

    agent = Agent(
        name="bench",
        model=ToolLoopModel(),
        tools=[function_tool(search_logs, name_override=TOOL_NAME)],
    )

    class AgentsRunner:
        checkpointer = None

        def invoke(self, n: int, config: Any, **kw: Any) -> Any:
            return Runner.run_sync(agent, QUESTION, max_turns=n + 5)

        async def ainvoke(self, n: int, config: Any, **kw: Any) -> Any:
            return await Runner.run(agent, QUESTION, max_turns=n + 5)

    def check(out: Any, n: int) -> str | None:
        final = out.final_output
        return None if final == FINAL_TEXT else f"ended with final_output {final!r:.60}"

    return System(name="openai_agents", graph=AgentsRunner(), make_input=lambda n: n, check=check)
