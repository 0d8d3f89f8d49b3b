"""A fencepost agent over a chat model, for ``langgraph dev``: what Agent Chat UI talks to.

The chat model is a deterministic stand-in that streams like a provider (text word by word, tool
calls in the last chunk): it searches the logs once, then answers through fencepost's internal
``final_answer`` tool citing that search. Self-contained: the server loads this file by path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

import fencepost as fp
from fencepost.demo import demo_registry


class StreamingIncidentModel(BaseChatModel):
    """Searches the checkout logs, then answers citing the search."""

    @property
    def _llm_type(self) -> str:
        return "streaming-incident-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=list(tools), **kwargs)

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return AIMessage(
                content="Let me look at the logs.",
                tool_calls=[
                    {"name": "search_logs", "args": {"service": "checkout"}, "id": "call-logs-1"}
                ],
            )
        text = "Checkout fails with a NullPointerException since the 14:00 release."
        return AIMessage(
            content="",
            tool_calls=[
                {
                    "name": "final_answer",
                    "args": {"text": text, "citations": [results[0].tool_call_id]},
                    "id": "call-final-1",
                }
            ],
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        reply = self._reply(messages)
        for word in str(reply.content).split(" ") if reply.content else ():
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word + " "))
            if run_manager is not None:
                run_manager.on_llm_new_token(word + " ", chunk=chunk)
            yield chunk
        calls = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
            for i, c in enumerate(reply.tool_calls)
        ]
        last = ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                tool_call_chunks=calls,  # type: ignore[arg-type]
                chunk_position="last",
            )
        )
        if run_manager is not None:
            run_manager.on_llm_new_token("", chunk=last)
        yield last


graph = fp.create_agent(StreamingIncidentModel(), list(demo_registry()))
