"""The StateGraph ``build_agent_graph`` returns: a plain LangGraph ``StateGraph`` whose compiled
graph never lets ``GraphRecursionError`` out once the run has ended with a reason.

With ``recursion_limit=1`` LangGraph runs the terminal node (which records
``step_budget_exhausted``) and then raises anyway: its step check runs before its "nothing left
to run" check. The run has ended as data by then, so the error is dropped and the ended state is
returned; any other ``GraphRecursionError`` is raised as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphRecursionError
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph

from fencepost.policy import Phase


class BoundedStateGraph(StateGraph[Any, Any, Any, Any]):
    """A ``StateGraph`` whose ``compile()`` returns a :class:`BoundedCompiledGraph`."""

    def compile(self, *args: Any, **kwargs: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
        compiled = super().compile(*args, **kwargs)
        compiled.__class__ = BoundedCompiledGraph
        return compiled


class BoundedCompiledGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled fencepost graph: LangGraph's, except as the module docstring says."""

    def _ended(self, config: RunnableConfig | None) -> bool:
        if config is None or self.checkpointer is None:
            return False
        try:
            return self.get_state(config).values.get("phase") is Phase.TERMINAL
        except Exception:
            return False

    async def _aended(self, config: RunnableConfig | None) -> bool:
        if config is None or self.checkpointer is None:
            return False
        try:
            return (await self.aget_state(config)).values.get("phase") is Phase.TERMINAL
        except Exception:
            return False

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        try:
            yield from super().stream(input, config, **kwargs)
        except GraphRecursionError:
            if not self._ended(config):
                raise

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        try:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
        except GraphRecursionError:
            if not await self._aended(config):
                raise
