"""Child runs: a compiled fencepost graph started as a tool of another run (a sub-agent).

The child spends its parent's budget, not a budget of its own beside it: its ledger account is
opened under the parent run's account, so every step and call it reserves is also reserved on the
parent (a parent of 100 cannot fund three children of 60 — the third, or the second, is refused
and ends ``*_budget_exhausted`` with the axis in its error code). That needs ONE ledger: build the
parent and the child graph with the same ledger object (or the same database); the parent's
account must be visible to the child's ledger, else the child ends ``policy_denied``
(``unknown_budget_account``).

What comes back to the parent is data, never the child's text: a :class:`ChildRunResult` (ids,
terminal reason, error code, the child's receipts, budget used, and the final answer payload if
there is one) becomes the parent call's result. A child that did not complete is still that
call's *result*, with ``completed=False`` and its reason visible: the parent's receipt says the
child ran and reported; whether its work was done is the result's ``termination``. A failure with
only an error code would drop the child's id and the effects it already made.

A child that did not complete is an incomplete call of its parent: the result is still data the
parent's model is shown (the child's reason, its receipts), but the parent's receipt for the call
is ``failed`` (``incomplete``), and the parent's answer cannot cite it as evidence.

Stopping is not undoing. Cancelling the parent closes its account; every account under it is then
closed too, so a running child is refused its next step or call and ends ``cancelled``. No child
starts under a closed parent, nor one whose parent cannot fund its first step: the call's result
says so (``started=False``), no checkpoint thread or ledger account is made for it, and the
parent's receipt is ``denied``: the stop report lists the call among those that never started. Cancelling
the task that runs a child (the parent's ``ainvoke``) writes the child's durable cancel record
before ``CancelledError`` goes on. The ids of children already started stay in the parent's
observations, with their receipts: what they did is reported, not rolled back.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import keyword
import logging
from collections.abc import Callable, Coroutine, Iterable
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel
from pydantic import BaseModel, ConfigDict, Field, Strict, create_model

from fencepost.graph.cancel import acancel, cancel
from fencepost.graph.containment.tools import finish_before_cancel
from fencepost.graph.settings import LoopConfig, settings_of
from fencepost.graph.state import has_run, run_output, start
from fencepost.policy import (
    AgentState,
    Balance,
    Clock,
    Deadline,
    Effect,
    ErrorCode,
    Ledger,
    Principal,
    Receipt,
    RuntimeBudget,
    StopRequest,
    TerminationReason,
    ToolContext,
    ToolError,
    ToolSpec,
    UnknownAccount,
)
from fencepost.policy.context import RunContext
from fencepost.policy.outcome import RunReport
from fencepost.policy.reservations import first_step_amounts
from fencepost.policy.stopping import child_start_refusal

__all__ = ["ChildRunConfigError", "ChildRunResult", "child_run_tool", "child_thread_id"]

T = TypeVar("T")

_log = logging.getLogger(__name__)

_RETURN_MARGIN_SECONDS = 1.0
"""The child's deadline ends this much (at most a tenth of what is left) before the parent call's,
so its typed result reaches the parent before the call itself times out."""


class ChildRunConfigError(ValueError):
    """``child_run_tool`` was given something it cannot run as a child; the message says why."""


class ChildRunResult(RunReport):
    """What a child run hands back to its parent: the parent call's result, as data.

    One that did not complete makes the parent's call ``failed`` (``incomplete``), its reason
    kept here: see :class:`~fencepost.policy.outcome.RunReport`.
    """

    run_id: str
    """The child run's id."""
    thread_id: str
    """The child's checkpoint thread: ``graph.get_state({"configurable": {"thread_id": ...}})``."""
    termination: Annotated[TerminationReason, Strict(False)]
    """Why the child ended (``completed`` only when it answered with verified citations)."""
    completed: bool
    """Whether the child completed. ``False`` is still a result: the reason is ``termination``."""
    started: bool = True
    """Whether a child run was started. ``False``: the call was refused before one began (its
    parent was closed, or could not fund the child's first step); ``termination`` and
    ``error_code`` say why, and ``thread_id`` names a thread with nothing on it. The parent's
    receipt is then ``denied`` (:meth:`refusal_code`): the call never started."""
    error_code: str | None = None
    """The child's safe stop code (``tool_calls_exhausted``, ``cancelled``, ...)."""
    receipts: Annotated[tuple[Receipt, ...], Strict(False)] = ()
    """The child's receipts: each call it made and what became of it (effects already made)."""
    budget: RuntimeBudget
    """What the child reserved, per axis (its share of the parent's budget)."""
    final_answer_text: str | None = None
    """The child's final answer payload, if it gave one: the only text of the child's model here."""
    citations: Annotated[tuple[str, ...], Strict(False)] = ()
    """The child's call ids its answer cites (evidence in the child's thread, not the parent's)."""

    def refusal_code(self) -> ErrorCode:
        """Why no child began, as the parent's receipt says it: ``cancelled`` under a stopped
        parent, ``budget_exhausted`` when the parent could not fund the first step, else
        ``permission_denied`` (the parent's account was closed for another reason)."""
        if self.termination is TerminationReason.CANCELLED:
            return ErrorCode.CANCELLED
        if self.termination in _UNFUNDED:
            return ErrorCode.BUDGET_EXHAUSTED
        return ErrorCode.PERMISSION_DENIED


_UNFUNDED = frozenset(
    {TerminationReason.STEP_BUDGET_EXHAUSTED, TerminationReason.TOOL_BUDGET_EXHAUSTED}
)


def _digest(*parts: str) -> str:
    joined = json.dumps(parts, ensure_ascii=True)
    return hashlib.sha256(joined.encode("ascii")).hexdigest()[:32]


def child_thread_id(parent_account: str, call_id: str, *, tenant_id: str, principal_id: str) -> str:
    """The checkpoint thread of the child started by call ``call_id`` of the run whose ledger
    account is ``parent_account``.

    The call id is the idempotency key: a retried or resumed call finds the same child thread and
    resumes it instead of starting a second child. The parent account is named from the parent's
    thread, and the identity is part of the name, so no call id a model chooses can reach another
    run's or another tenant's child.
    """
    return f"fencepost-child-{_digest(parent_account, tenant_id, principal_id, call_id)}"


def _child_run_id(thread_id: str) -> str:
    return f"child-{_digest('run', thread_id)}"


def _child_deadline(deadline: Deadline, clock: Clock) -> Deadline:
    left = deadline.remaining_seconds(clock=clock)
    margin = max(0.0, min(_RETURN_MARGIN_SECONDS, left / 10))
    return Deadline(at=deadline.at - timedelta(seconds=margin))


def _result(state: AgentState, thread_id: str) -> ChildRunResult:
    termination = state.termination
    if termination is None:
        raise ToolError(ErrorCode.INTERNAL_ERROR)
    answer = state.final_answer
    return ChildRunResult(
        run_id=state.run_id,
        thread_id=thread_id,
        termination=termination,
        completed=termination is TerminationReason.COMPLETED,
        error_code=state.last_error_code,
        receipts=tuple(state.receipts),
        budget=state.budget,
        final_answer_text=answer.text if answer is not None else None,
        citations=tuple(answer.citations) if answer is not None else (),
    )


def _not_started(
    run_id: str, thread_id: str, budget: RuntimeBudget, why: StopRequest
) -> ChildRunResult:
    return ChildRunResult(
        run_id=run_id,
        thread_id=thread_id,
        termination=why.reason,
        completed=False,
        started=False,
        error_code=why.error_code,
        budget=budget,
    )


def _outside_the_node(fn: Callable[[], T]) -> T:
    """``fn()`` with the parent node's LangGraph config cleared (see :func:`_isolated`)."""
    var_child_runnable_config.set(None)
    return fn()


async def _isolated(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` outside the parent node's LangGraph config.

    Invoked inside a node, a graph inherits the node's config from a context variable (its
    callbacks, recursion limit, stream writer): it would run as the parent's subgraph. A child run
    is a run of its own, on its own thread. Cancelling the caller cancels the child with it.
    """
    context = contextvars.copy_context()
    context.run(var_child_runnable_config.set, None)
    task = asyncio.get_running_loop().create_task(work, context=context)
    return await task


class _Driver:
    """How a child graph is run: through its checkpointer's async methods, or — a saver with
    sync methods only (``SqliteSaver``, what ``open_checkpointer("sqlite:///...")`` gives) —
    through the graph's sync methods on a worker thread. Which one is found on first use: such a
    saver says so by raising ``NotImplementedError`` from its async methods, before anything ran.
    """

    def __init__(self, graph: Pregel[Any, Any, Any, Any]) -> None:
        self.graph = graph
        self.sync: bool | None = None

    async def values(self, config: RunnableConfig) -> dict[str, Any]:
        if self.sync is None:
            try:
                values = dict((await self.graph.aget_state(config)).values)
            except NotImplementedError:
                self.sync = True
            else:
                self.sync = False
                return values
        if self.sync:
            snapshot = await asyncio.to_thread(
                _outside_the_node, lambda: self.graph.get_state(config)
            )
            return dict(snapshot.values)
        return dict((await self.graph.aget_state(config)).values)

    async def invoke(self, value: Any, config: RunnableConfig, ctx: RunContext) -> dict[str, Any]:
        # Each step's checkpoint is written before the next begins: a child cancelled with its
        # caller finds its run on its thread, however soon after it started, and ends it typed
        # (with LangGraph's default, the latest checkpoint may still be on its way).
        if self.sync:
            return dict(
                await asyncio.to_thread(
                    _outside_the_node,
                    lambda: self.graph.invoke(value, config, context=ctx, durability="sync"),
                )
            )
        return dict(
            await _isolated(self.graph.ainvoke(value, config, context=ctx, durability="sync"))
        )

    async def cancel(self, config: RunnableConfig, ctx: RunContext) -> None:
        if self.sync:
            await asyncio.to_thread(
                _outside_the_node, lambda: cancel(self.graph, config, context=ctx)
            )
        else:
            await _isolated(acancel(self.graph, config, context=ctx))


_RECORD_GRACE_SECONDS = 10.0
"""How long a child's cancel record is waited for once its caller is cancelled again: the
record is two local writes (the stop, then the terminal node's ending), milliseconds."""


async def _ended_cancelled(driver: _Driver, config: RunnableConfig, ctx: RunContext) -> None:
    """Write the durable cancel record of a child whose run was cancelled with its caller.

    Shielded, and waited for through further cancels of the caller (LangGraph's runner cancels
    the tasks of a step it stops), within :data:`_RECORD_GRACE_SECONDS`: the child's thread has
    its ending before ``CancelledError`` goes on, so a caller that cancels and then reads the
    child never finds it half-ended. A failure to write it is logged and never replaces the
    ``CancelledError`` that goes on.
    """
    loop = asyncio.get_running_loop()
    record = finish_before_cancel(driver.cancel(config, ctx))
    until = loop.time() + _RECORD_GRACE_SECONDS
    while not record.done() and loop.time() < until:
        try:
            await asyncio.wait_for(asyncio.shield(record), until - loop.time())
        except asyncio.CancelledError:
            continue  # cancelled again: the record is still on its way
        except TimeoutError:
            break
        except Exception:  # logged below, from the record itself
            break
    if record.done() and not record.cancelled() and record.exception() is not None:
        _log.error(
            "a cancelled child run's cancel record could not be written",
            exc_info=record.exception(),
        )


async def _funding_refusal(
    ledger: Ledger, parent: str, budget: RuntimeBudget, tokens_per_step: int
) -> StopRequest | None:
    """Why no child may start under ``parent`` (closed, or unable to fund its first step)."""
    chain: list[Balance] = []
    account: str | None = parent
    while account is not None and all(b.account != account for b in chain):
        try:
            balance = await ledger.abalance(account)
        except (UnknownAccount, ValueError):
            return None  # the child's own opening refuses it, typed (unknown_budget_account)
        chain.append(balance)
        account = balance.parent
    return child_start_refusal(budget.limits(), chain, first_step_amounts(tokens_per_step))


async def _run_child(
    driver: _Driver,
    config: RunnableConfig,
    ctx: RunContext,
    question: str,
    budget: RuntimeBudget,
    run_id: str,
    refusal: Callable[[], Coroutine[Any, Any, StopRequest | None]],
) -> AgentState | StopRequest:
    values = await driver.values(config)
    if not has_run(values):
        refused = await refusal()
        if refused is not None:
            return refused
        return run_output(await driver.invoke(start(question, budget, run_id=run_id), config, ctx))
    state = run_output(values)
    if state.is_terminal:
        return state
    # An earlier attempt of this call started the child and never reported: resume it.
    return run_output(await driver.invoke(None, config, ctx))


def _checked_graph(
    graph: object, ledger: Ledger | None
) -> tuple[Pregel[Any, Any, Any, Any], LoopConfig]:
    settings = settings_of(graph)
    if settings is None:
        raise ChildRunConfigError("graph must be a graph built by build_agent_graph")
    if not isinstance(graph, Pregel):
        raise ChildRunConfigError(
            "graph must be compiled: build_agent_graph(...).compile(checkpointer=...)"
        )
    if not isinstance(getattr(graph, "checkpointer", None), BaseCheckpointSaver):
        raise ChildRunConfigError(
            "the child graph needs its own checkpointer (compile(checkpointer=...)): a retried "
            "call resumes its child's thread instead of starting a second child"
        )
    if settings.approval != "terminate":
        raise ChildRunConfigError(
            "the child graph must be built with approval='terminate': a child cannot pause for "
            "a human approval inside its parent's tool call"
        )
    if ledger is not None and ledger is not settings.ledger:
        raise ChildRunConfigError(
            "the parent's ledger is not the child graph's: build both graphs with the same "
            "ledger object, so the child's account can be opened under the parent run's account"
        )
    return graph, settings


def child_run_tool(
    graph: Pregel[Any, Any, Any, Any],
    *,
    name: str,
    description: str,
    budget: RuntimeBudget,
    capability: str,
    capabilities: Iterable[str],
    effect: Effect = Effect.READ,
    question_field: str = "question",
    timeout_seconds: float = 300.0,
    ledger: Ledger | None = None,
) -> ToolSpec:
    """A tool whose body starts a child run of ``graph`` (a compiled fencepost graph).

    The model calls it with one string argument, ``question_field``, the child's question. The
    child run:

    - is opened under the parent run's ledger account, with ``budget`` as its own limits: it can
      never spend more than ``budget`` nor more than its parent has left (on any axis the parent
      limits, model steps included);
    - acts for the parent's tenant and principal id, holding exactly ``capabilities`` (trusted
      configuration, like ``capability``, which a principal must hold to start the child: holding
      it delegates those capabilities to the child);
    - has the parent call's deadline (the parent run's remainder, at most ``timeout_seconds``),
      less a small margin to hand its result back;
    - runs on a thread derived from the parent run and the call id (:func:`child_thread_id`), so a
      retried call resumes its child instead of starting a second one (the tool is idempotent).

    The call's result is a :class:`ChildRunResult` (JSON data in the parent's observation); one
    saying ``completed=False`` makes the parent's receipt ``failed`` (``incomplete``). No child
    starts under a closed parent account or one that cannot fund the child's first step: the
    result then says ``started=False`` and why, and the call is receipted ``denied`` (it never
    started), not ``failed``. The call fails only when no child could be run:
    a tool context without the parent's account (``permission_denied``) or a child thread held by
    another identity (``permission_denied``). Cancelling the call's task ends a running child
    ``cancelled``, durably, before ``CancelledError`` goes on.

    ``graph`` must be compiled with a checkpointer (one with sync methods only, such as
    ``SqliteSaver``, runs the child on a worker thread) and built with ``approval="terminate"``
    and the parent's ledger: pass that ledger as ``ledger`` to have it checked here.
    """
    checked, settings = _checked_graph(graph, ledger)
    if not isinstance(budget, RuntimeBudget):
        raise ChildRunConfigError("budget must be a RuntimeBudget")
    if (
        not isinstance(question_field, str)
        or not question_field.isidentifier()
        or keyword.iskeyword(question_field)
        or question_field.startswith(("_", "model_"))
    ):
        raise ChildRunConfigError("question_field must be a plain identifier")
    if isinstance(capabilities, str):
        raise ChildRunConfigError("capabilities must be a collection of capability names")
    granted = frozenset(capabilities)
    if not all(isinstance(c, str) and c for c in granted):
        raise ChildRunConfigError("capabilities must be non-empty strings")
    args_model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        "ChildRunArgs",
        __config__=ConfigDict(extra="forbid", strict=True),
        **{
            question_field: (
                Annotated[str, Field(min_length=1, max_length=20_000)],
                Field(description="The question the sub-agent works on."),
            )
        },
    )
    clock = settings.clock
    driver = _Driver(checked)

    async def execute(args: BaseModel, ctx: ToolContext) -> ChildRunResult:
        parent = ctx.budget_account
        if not parent:
            # A child outside its parent's account would spend a budget nobody caps.
            raise ToolError(ErrorCode.PERMISSION_DENIED)
        thread = child_thread_id(
            parent, ctx.idempotency_key, tenant_id=ctx.tenant_id, principal_id=ctx.principal_id
        )
        child_ctx = RunContext(
            tenant_id=ctx.tenant_id,
            principal=Principal(id=ctx.principal_id, capabilities=granted),
            deadline=_child_deadline(ctx.deadline, clock),
            budget_account=parent,
            # The same caller's objects: the child's tools act on what the parent's do.
            injected=ctx.injected,
        )
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        question = getattr(args, question_field)
        run_id = _child_run_id(thread)

        async def refusal() -> StopRequest | None:
            return await _funding_refusal(settings.ledger, parent, budget, settings.tokens_per_step)

        try:
            state = await _run_child(driver, config, child_ctx, question, budget, run_id, refusal)
        except asyncio.CancelledError:
            # Stopping is not undoing: the child's run ends typed, on its own thread, first.
            await _ended_cancelled(driver, config, child_ctx)
            raise
        if isinstance(state, StopRequest):
            return _not_started(run_id, thread, budget, state)
        if state.tenant_id != ctx.tenant_id or state.principal_id != ctx.principal_id:
            raise ToolError(ErrorCode.PERMISSION_DENIED)
        return _result(state, thread)

    return ToolSpec(
        name=name,
        description=description,
        args_model=args_model,
        effect=effect,
        capability=capability,
        timeout_seconds=timeout_seconds,
        execute=execute,
        idempotent=True,
    )
