"""Shared kit for the adapter tests: a LangChain fake chat model with ``bind_tools``, LangChain
tools wrapped with ``tool_spec``, and helpers to run the real compiled graph.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import ToolException, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

import fencepost as fp
from fencepost.adapters.chat_model import UNTRUSTED_KEY, ChatModelDecider
from fencepost.adapters.tools import tool_spec
from tests.unhurried import UNHURRIED_SECONDS

SECRET = "password=hunter2 in /srv/app/db.py"
"""Text a failing tool or provider emits; it must never reach the model, state or checkpoint."""

Step = AIMessage | str | BaseException | Callable[[list[BaseMessage]], Any]


class FakeToolChatModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` that supports ``bind_tools`` and records what it was given.

    Each entry of ``messages`` is an ``AIMessage``, plain text, an exception to raise (as a
    provider error would be), or a callable of the messages received returning one of those.
    """

    messages: Iterator[Any]  # type: ignore[assignment]
    received: list[list[BaseMessage]] = Field(default_factory=list)
    bound_tools: list[list[dict[str, Any]]] = Field(default_factory=list)
    requests: list[tuple[list[BaseMessage], list[dict[str, Any]]]] = Field(default_factory=list)
    """Each call's messages and bound tools, appended together (so calls from several threads
    stay paired)."""

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(list(messages))
        self.bound_tools.append(list(kwargs.get("tools") or []))
        self.requests.append((list(messages), list(kwargs.get("tools") or [])))
        item = next(self.messages)
        if callable(item) and not isinstance(item, BaseException):
            item = item(list(messages))
        if isinstance(item, BaseException):
            raise item
        message = AIMessage(content=item) if isinstance(item, str) else item
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """As a provider streams: the text word by word, then the tool calls in the last chunk
        (``GenericFakeChatModel`` streams text only)."""
        message = self._generate(messages, stop, run_manager, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        text = message.content if isinstance(message.content, str) else ""
        words = [w for w in re.split(r"(\s)", text) if w]
        calls = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
            for i, c in enumerate(message.tool_calls)
        ]
        for n, word in enumerate(words):
            chunk = AIMessageChunk(content=word, id=message.id)
            if run_manager is not None:
                run_manager.on_llm_new_token(word, chunk=ChatGenerationChunk(message=chunk))
            yield ChatGenerationChunk(message=chunk)
            if n == len(words) - 1 and not calls:
                return
        last = AIMessageChunk(
            content="",
            id=message.id,
            tool_call_chunks=calls,  # type: ignore[arg-type]
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
        if run_manager is not None:
            run_manager.on_llm_new_token("", chunk=ChatGenerationChunk(message=last))
        yield ChatGenerationChunk(message=last)


def fake_model(steps: Sequence[Step]) -> FakeToolChatModel:
    return FakeToolChatModel(messages=iter(list(steps)))


def ai_call(name: str, args: dict[str, Any], call_id: str, **kw: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}], **kw)


def ai_calls(*calls: tuple[str, dict[str, Any], str]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls])


def ai_final(text: str, citations: Sequence[str] = ()) -> AIMessage:
    return ai_call(
        "final_answer",
        {"text": text, "citations": list(citations)},
        f"final-{uuid.uuid4().hex[:8]}",
    )


def final_citing_all(messages: list[BaseMessage]) -> AIMessage:
    """An answer citing every tool result the model was shown."""
    ids = [m.tool_call_id for m in messages if isinstance(m, ToolMessage) and m.status == "success"]
    return ai_final("deploy 42 broke checkout", ids)


class RateLimitError(Exception):
    """Shaped like a provider client's rate-limit error: a status code and a chatty message."""

    status_code = 429


@dataclass
class ToolLog:
    """Every tool body that actually ran, with what it received."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def langchain_registry(log: ToolLog, *, extra: Sequence[fp.ToolSpec] = ()) -> fp.ToolRegistry:
    """A registry of ordinary LangChain ``@tool`` functions wrapped with ``tool_spec``."""

    @tool
    async def search_logs(query: str, limit: int = 10) -> dict[str, Any]:
        """Search the service logs."""
        log.calls.append(("search_logs", {"query": query, "limit": limit}))
        # Later queries finish first: results must still be joined by call id.
        await asyncio.sleep(0.05 if query.endswith("a") else 0.0)
        return {"query": query, "hits": [f"500 /checkout ({query})"]}

    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        log.calls.append(("explode", {"reason": reason}))
        raise ToolException(f"{reason}: {SECRET}")

    return fp.ToolRegistry(
        [
            tool_spec(
                search_logs, effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5
            ),
            tool_spec(
                explode,
                effect=fp.Effect.READ,
                capability="logs:read",
                timeout_seconds=UNHURRIED_SECONDS,
            ),
            *extra,
        ]
    )


def ctx(
    caps: Sequence[str] = ("logs:read",), *, seconds: float = UNHURRIED_SECONDS
) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities=frozenset(caps)),
        deadline=fp.Deadline.after(seconds),
    )


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:12]}"}}


def build(registry: fp.ToolRegistry, model: Any, *, checkpointer: Any = None, **kw: Any) -> Any:
    saver = checkpointer or InMemorySaver()
    return fp.build_agent_graph(registry, model, **kw).compile(checkpointer=saver)


async def arun(
    graph: Any,
    *,
    steps: int = 6,
    tools: int = 4,
    context: fp.RunContext | None = None,
    config: dict[str, Any] | None = None,
    question: str = "why is checkout failing?",
) -> fp.AgentState:
    out = await graph.ainvoke(
        fp.start(question, fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)),
        config or thread(),
        context=context or ctx(),
    )
    return fp.run_output(out)


def decider(steps: Sequence[Step], **kw: Any) -> tuple[ChatModelDecider, FakeToolChatModel]:
    chat = fake_model(steps)
    return ChatModelDecider(chat, **kw), chat


def data_block(message: ToolMessage) -> Any:
    """The value inside a tool message's untrusted-data block (asserting it is one)."""
    content = json.loads(str(message.content))
    assert set(content) == {UNTRUSTED_KEY}, content
    return content[UNTRUSTED_KEY]


# -- a decider's input, built by hand ------------------------------------------------------------


def idle_decider(history_size: int = 4096, **options: Any) -> ChatModelDecider:
    """A decider over a chat model it is never asked to call (for ``messages()`` alone): it keeps
    nothing it is given, so a test can watch what the decider itself holds on to."""

    class _Unused(GenericFakeChatModel):
        def bind_tools(self, tools: object, **kwargs: object) -> Any:
            return self

    return ChatModelDecider(
        _Unused(messages=iter([AIMessage(content="unused")])), history_size=history_size, **options
    )


def tool_observation(n: int, result: dict[str, Any]) -> fp.policy.Observation:
    """Observation ``n`` of a run: call ``call_<n>`` of ``search_logs`` at step ``n + 1``."""
    return fp.policy.Observation(
        sequence=n,
        step=n + 1,
        call_id=f"call_{n:010d}",
        tool_name="search_logs",
        kind="tool_result",
        result=result,
    )


def decision_input(
    observations: tuple[fp.policy.Observation, ...],
    arguments: dict[str, Any],
    *,
    run_id: str = "run-x",
) -> fp.DecisionInput:
    """The input of the next step after ``observations``, each proposed with ``arguments``."""
    proposals = tuple(
        fp.ToolProposal(call_id=o.call_id, tool_name=o.tool_name, arguments=arguments)
        for o in observations
    )
    return fp.DecisionInput(
        run_id=run_id,
        question="q",
        observations=observations,
        proposals=proposals,
        catalog=(),
        budget=fp.RuntimeBudget(steps_remaining=99, tool_calls_remaining=99),
        step=len(observations) + 1,
    )
