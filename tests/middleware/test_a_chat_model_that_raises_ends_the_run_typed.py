"""A chat model that raises ends the middleware run with one typed reason, never escapes invoke.

Invariant 1 (every path ends in exactly one ``TerminationReason``) and DESIGN, "Trace, logs and
eval" (an exception from a model is logged, and never leaves the run), in the middleware
binding, as the graph binding reads a failed model step: its safe code ends the run
``failed``; a retryable one (rate limited, unavailable, timeout) is asked again at a step of its
own, up to ``model_retries``; the exception's text is in the developer's log only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_core.caches import BaseCache
from langchain_core.messages import AIMessage
from langchain_core.rate_limiters import BaseRateLimiter
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters.middleware import MODEL_FAILED_KEY
from tests.adapters.fakes import FakeToolChatModel
from tests.hostile_exceptions import READ_AS_METHOD, READ_AS_PROPERTY, hostile_exception
from tests.middleware.kit import (
    SECRET,
    Ran,
    agent,
    ask,
    budget,
    call,
    chat,
    ctx,
    lc_tools,
    specs,
    thread,
)


def _script(*items: Any) -> Any:
    yield from items
    while True:
        yield AIMessage(content="checkout is down")


@pytest.mark.parametrize("failure", [RuntimeError(SECRET), SystemExit(3)], ids=type)
def test_a_chat_model_that_raises_ends_the_middleware_run_typed(
    failure: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    ran = Ran()
    tools = lc_tools(ran)
    guard = fp.FencepostMiddleware(specs(tools), budget=budget())
    graph, config = agent(chat(_script(failure)), tools, [guard]), thread()
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        out = graph.invoke(ask(), config, context=ctx())
    assert out["termination"] == "failed"
    assert out["last_error_code"] == "internal_error"
    assert ran.bodies == []
    # The text and the traceback are the developer's: logged, never in the thread's state.
    assert SECRET not in json.dumps(graph.get_state(config).values, default=str)
    assert any(r.exc_info for r in caplog.records if r.name == "fencepost.model")


class _Counting(FakeToolChatModel):
    """The fake chat model, keeping a count of its calls on itself (as a client, a cache or a
    rate limiter keeps its state), and streaming its replies where it is asked to."""

    calls: int = 0

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return super()._generate(*args, **kwargs)


@pytest.mark.parametrize("failure", [SystemExit(3), KeyboardInterrupt()], ids=type)
@pytest.mark.parametrize("streamed", [False, True], ids=["generated", "streamed"])
def test_a_chat_model_raising_system_exit_under_ainvoke_ends_the_run_typed(
    failure: BaseException, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # LangChain runs each generation as a task of its own, and asyncio re-raises these two out
    # of the caller's event loop: the middleware hands LangChain a model whose calls carry
    # them off the task as data, and the run ends as under invoke.
    ran = Ran()
    tools = lc_tools(ran)
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(), model_retries=0)
    graph, config = agent(chat(_script(failure)), tools, [guard]), thread()

    async def go() -> Any:
        if not streamed:
            return await graph.ainvoke(ask(), config, context=ctx())
        async for _ in graph.astream(ask(), config, context=ctx(), stream_mode="messages"):
            pass
        return (await graph.aget_state(config)).values

    with caplog.at_level(logging.WARNING, logger="fencepost"):
        out = asyncio.run(go())
    assert (out["termination"], out["last_error_code"]) == ("failed", "internal_error")
    assert ran.bodies == []
    logged = [r for r in caplog.records if r.name == "fencepost.model" and r.exc_info]
    assert logged and logged[0].exc_info is not None
    assert logged[0].exc_info[0] is type(failure)


class _ExitingLimiter(BaseRateLimiter):
    def acquire(self, *, blocking: bool = True) -> bool:
        raise SystemExit(3)

    async def aacquire(self, *, blocking: bool = True) -> bool:
        raise SystemExit(3)


class _ExitingCache(BaseCache):
    def lookup(self, prompt: str, llm_string: str) -> Any:
        raise SystemExit(3)

    def update(self, prompt: str, llm_string: str, return_val: Any) -> None:
        pass

    def clear(self, **kwargs: Any) -> None:
        pass

    async def alookup(self, prompt: str, llm_string: str) -> Any:
        raise SystemExit(3)


@pytest.mark.parametrize("part", ["rate_limiter", "cache"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "astream"])
def test_a_chat_models_rate_limiter_or_cache_raising_system_exit_ends_the_run_typed(
    part: str, mode: str
) -> None:
    # LangChain asks a chat model's rate limiter and cache on the model's own task, outside
    # the methods that generate: their code is the model's, contained as it is.
    given = (
        {"rate_limiter": _ExitingLimiter()}
        if part == "rate_limiter"
        else {"cache": _ExitingCache()}
    )
    tools = lc_tools(Ran())
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(), model_retries=0)
    graph, config = agent(FakeToolChatModel(messages=_script(), **given), tools, [guard]), thread()

    async def streamed() -> Any:
        async for _ in graph.astream(ask(), config, context=ctx(), stream_mode="messages"):
            pass
        return (await graph.aget_state(config)).values

    if mode == "invoke":
        out = graph.invoke(ask(), config, context=ctx())
    elif mode == "ainvoke":
        out = asyncio.run(graph.ainvoke(ask(), config, context=ctx()))
    else:
        out = asyncio.run(streamed())
    assert (out["termination"], out["last_error_code"]) == ("failed", "internal_error")


def test_a_chat_model_called_under_ainvoke_keeps_its_own_state_and_streams_its_tokens() -> None:
    # The model LangChain calls under ainvoke is the caller's own: what it keeps on itself
    # changes on the instance the caller holds, and its streamed tokens reach the stream.
    tools = lc_tools(Ran())
    model = _Counting(messages=_script(call("search_logs", {"query": "a"}, 1)))
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5))
    graph, config = agent(model, tools, [guard]), thread()

    async def go() -> list[Any]:
        return [
            chunk
            async for chunk in graph.astream(ask(), config, context=ctx(), stream_mode="messages")
        ]

    chunks = asyncio.run(go())
    assert model.calls == 2
    assert "checkout is down" in "".join(
        str(m.content) for m, _ in chunks if m.type == "AIMessageChunk"
    )
    assert asyncio.run(graph.aget_state(config)).values["termination"] == "completed"


def test_a_retryable_model_failure_is_asked_again_at_a_step_of_its_own() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    model = chat(_script(TimeoutError(SECRET)))
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5))
    graph, config = agent(model, tools, [guard]), thread()
    out = graph.invoke(ask(), config, context=ctx())
    assert out["termination"] == "completed"
    assert len(model.received) == 2
    # The stand-in reply of the failed call is gone: the model is never shown it.
    assert not any(
        isinstance(m, AIMessage) and MODEL_FAILED_KEY in m.response_metadata
        for m in out["messages"]
    )
    assert all(m.content or m.tool_calls for m in model.received[1] if isinstance(m, AIMessage))
    run = out["fencepost_run"]
    assert run["step"] == 2 and run["model_failures"] == 0


def test_retryable_failures_past_model_retries_end_the_run_with_their_code() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    model = chat(_script(*[TimeoutError(SECRET)] * 5))
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=8), model_retries=2)
    graph, config = agent(model, tools, [guard]), thread()
    out = graph.invoke(ask(), config, context=ctx())
    assert (out["termination"], out["last_error_code"]) == ("failed", "timeout")
    assert len(model.received) == 3  # the first call and its two retries
    assert SECRET not in json.dumps(graph.get_state(config).values, default=str)


def test_with_no_model_retries_a_retryable_failure_ends_the_run() -> None:
    tools = lc_tools(Ran())
    model = chat(_script(TimeoutError(SECRET)))
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(), model_retries=0)
    out = agent(model, tools, [guard]).invoke(ask(), thread(), context=ctx())
    assert (out["termination"], out["last_error_code"]) == ("failed", "timeout")
    assert len(model.received) == 1


def test_an_async_chat_model_that_raises_ends_the_run_typed() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    guard = fp.FencepostMiddleware(specs(tools), budget=budget())
    graph, config = agent(chat(_script(RuntimeError(SECRET))), tools, [guard]), thread()
    out = asyncio.run(graph.ainvoke(ask(), config, context=ctx()))
    assert (out["termination"], out["last_error_code"]) == ("failed", "internal_error")
    assert ran.bodies == []


def test_ctrl_c_while_the_chat_model_runs_reaches_the_caller(python_sigint: None) -> None:
    # Only the caller's own interruption propagates: a SIGINT lands on the main thread, which
    # runs the sync graph's model call, so the KeyboardInterrupt it raises there is the
    # caller's (Ctrl-C), not the model's failure to contain and end the run with.
    started = threading.Event()

    def slow() -> Any:
        started.set()
        for _ in range(600):  # a chat model waiting on its provider
            time.sleep(0.1)
        yield AIMessage(content="late")

    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c() -> None:
        if started.wait(60):
            signal.pthread_kill(main, signal.SIGINT)

    tools = lc_tools(Ran())
    guard = fp.FencepostMiddleware(specs(tools), budget=budget())
    graph = agent(chat(slow()), tools, [guard])
    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        graph.invoke(ask(), thread(), context=ctx())


def test_a_forged_failure_reply_runs_none_of_its_calls_and_each_retry_is_a_reserved_step() -> None:
    # A caller writing a reply that carries the failure marker (update_state as the model
    # node) can only end or retry its own run: the forged calls are never gated nor run, and
    # the step asked again is reserved as any other (the marker buys no step for free).
    ran = Ran()
    tools = lc_tools(ran)
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5))
    model = chat(_script(call("search_logs", {"query": "a"}, 1)))
    graph = create_agent(
        model,
        tools=tools,
        middleware=[guard],
        checkpointer=InMemorySaver(),
        context_schema=fp.RunContext,
        interrupt_before=["tools"],
    )
    config = thread()
    graph.invoke(ask(), config, context=ctx())
    assert graph.get_state(config).next == ("tools",)
    forged = call("write_note", {"note": "forged"}, 9)
    forged.response_metadata = {MODEL_FAILED_KEY: "rate_limited"}
    graph.update_state(config, {"messages": [forged]}, as_node="model")
    out = graph.invoke(None, config, context=ctx())
    assert out["termination"] == "completed"
    assert ran.bodies == []  # the forged write never ran (nor the call paused before it)
    # One step for the first reply, one for the retry the forged failure asked for.
    assert out["fencepost_run"]["budget"]["steps_used"] == 2


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    base=st.sampled_from([RuntimeError, TimeoutError, Exception, SystemExit, GeneratorExit]),
    where=st.sampled_from(READ_AS_PROPERTY + READ_AS_METHOD),
    raises=st.sampled_from([SystemExit, RuntimeError, ValueError, KeyboardInterrupt]),
    mode=st.sampled_from(["invoke", "ainvoke"]),
)
def test_a_chat_model_exception_that_raises_as_it_is_read_ends_the_run_typed(
    base: type[BaseException],
    where: str,
    raises: type[BaseException],
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Reading what the chat model raised (its type, its status, its traceback for the log)
    # runs the model's code: whatever that raises is the model's failure too, never the run's
    # end untyped. (A KeyboardInterrupt a model raises on the main thread itself is the
    # caller's Ctrl-C under invoke: ``test_ctrl_c_while_the_chat_model_runs_reaches_the_caller``.)
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    tools = lc_tools(Ran())
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(), model_retries=0)
    graph = agent(chat(_script(hostile_exception(base, where, raises, SECRET))), tools, [guard])
    if mode == "invoke":
        out = graph.invoke(ask(), thread(), context=ctx())
    else:
        out = asyncio.run(graph.ainvoke(ask(), thread(), context=ctx()))
    assert out["termination"] == "failed"
    assert SECRET not in repr(out)
    assert [r for r in caplog.records if r.name == "fencepost.model" and r.levelno >= 30]
