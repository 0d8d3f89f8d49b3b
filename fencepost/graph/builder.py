"""``build_agent_graph``: the bounded loop as an uncompiled LangGraph ``StateGraph``."""

from __future__ import annotations

import weakref
from dataclasses import replace
from functools import partial
from typing import Any

from langgraph.graph import END, START, StateGraph

from fencepost.graph.approve import approve
from fencepost.graph.compiled import BoundedStateGraph
from fencepost.graph.context import ContextInput
from fencepost.graph.decide import decide
from fencepost.graph.default_ledger import LedgerNeeded, durable_ledger
from fencepost.graph.execute import execute
from fencepost.graph.node_io import loop_node
from fencepost.graph.routing import (
    route_after_approve,
    route_after_decide,
    route_after_execute,
    route_after_terminal,
    route_start,
)
from fencepost.graph.settings import GraphConfigError, LoopConfig, loop_config, remember
from fencepost.graph.state import GraphState, InputState
from fencepost.graph.terminal import terminal
from fencepost.policy import (
    DEFAULT_REPEAT_LIMIT,
    Clock,
    DecisionModel,
    InMemoryLedger,
    Ledger,
    ToolRegistry,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver
from fencepost.policy.context import RunContext
from fencepost.policy.denial import DenialMode
from fencepost.policy.pricing import PRICES, ModelPrice, PriceTable
from fencepost.policy.provenance import ProvenanceMode
from fencepost.policy.repair import DEFAULT_REPAIR_ATTEMPTS
from fencepost.policy.tool import NeedsApproval


def build_agent_graph(
    registry: ToolRegistry,
    model: DecisionModel,
    *,
    approval: ApprovalMode = "terminate",
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    ledger: Ledger | None = None,
    clock: Clock | None = None,
    model_timeout_seconds: float = 120.0,
    require_citations: bool = False,
    model_retries: int = 2,
    max_concurrent_tools: int = 8,
    verdict_key: bytes | None = None,
    tokens_per_step: int | None = None,
    answer_margin: int = 1,
    repair_attempts: int = DEFAULT_REPAIR_ATTEMPTS,
    denial: DenialMode = "end_run",
    approver: Approver | None = None,
    needs_approval: NeedsApproval | None = None,
    approval_right: str | None = None,
    four_eyes: bool = False,
    price: str | ModelPrice | None = None,
    prices: PriceTable = PRICES,
    provenance: ProvenanceMode = "observe",
) -> StateGraph[Any, RunContext, Any, Any]:
    """The bounded loop as an uncompiled ``StateGraph`` — compile it with your checkpointer.

    :func:`fencepost.create_agent` builds and compiles it in one call; this is for compiling your
    own (your ``compile`` arguments, or the loop as a node of a graph of yours). Every setting is
    keyword-only, and :class:`GraphConfigError` names the one given a bad value.

    - ``approval`` (``"terminate"``): ``"terminate"`` ends a run that proposes a write/external
      effect as ``approval_required``; ``"interrupt"`` pauses it with LangGraph ``interrupt()``
      until the caller resumes with ``Command(resume="approve" | "reject" | {"decision":
      "edit", ...})``.
    - ``repeat_limit`` (2): how many times the same call (same tool, same canonical arguments,
      same result) may repeat before the run ends ``no_progress``, before anything is spent.
    - ``ledger`` (one as durable as the checkpointer, :mod:`fencepost.graph.default_ledger`):
      the one budget truth. Every step, tool call, token, cost unit and mutation is reserved
      there before it is spent, and the state's ``budget`` is its view; a run's limits and owner
      are the ledger's, never read back from state. Without one, every graph compiled with the
      same checkpointer shares one ledger: in memory beside an ``InMemorySaver`` (one per saver
      object, so an agent built per request on one saver keeps one budget truth), in the same
      SQLite file beside a ``SqliteSaver``, in the same store beside one ``open_checkpointer``
      opened; any other checkpointer is refused at compile (``GraphConfigError`` naming the
      ledger to pass). Compiled with no checkpointer of its own (nested in a graph of yours),
      the graph keeps an in-memory ledger of its own: build it once, or pass one. A ledger that
      holds no account of a run it is asked to resume (a fresh ``InMemoryLedger``, one lost with
      its process) refuses it: the run ends ``policy_denied`` (``unknown_budget_account``) and
      nothing it paused runs. A durable ledger (SQLite/Postgres) makes reservations survive a
      crash mid-call, so a retried step or call is charged once per attempt and an uncertain
      write is reported as such, and it enforces limits across processes.
    - ``clock`` (the system clock): what deadlines are measured with (a fake one in tests).
    - ``model_timeout_seconds`` (120): the longest one model step may take, inside the run's
      deadline; a step past it is a ``timeout`` model error.
    - ``require_citations`` (``False``): refuse a final answer that cites no evidence (a
      chat model's plain-text reply, or ``citations=[]``); by default it completes.
    - ``model_retries`` (2): a retryable model error (``rate_limited``, ``unavailable``,
      ``timeout``) is asked again at the next step, up to this many times in a row; each retry
      spends its own step.
    - ``max_concurrent_tools`` (8): a batch of tool calls runs concurrently, at most this many at
      a time.
    - ``verdict_key`` (``None``): a secret the caller keeps, the same for every process serving
      the graph. The gate seals each allowed verdict with it and the executor runs only sealed
      ones: a verdict written into the checkpoint by anyone else (``update_state``, a database
      edit) never runs.
    - ``tokens_per_step`` (the model's own ``token_estimate``; ``ChatModelDecider`` takes it from
      the chat model's ``max_tokens``): the model's output cap. A model step holds a bounded
      estimate before the model is called — the input it is about to send, counted (by
      ``tiktoken`` when it is installed and loads, else at four characters a token), plus this
      cap (4,096 when neither gives one) — capped at what the run and its parent accounts have
      not spent; never all that is left. Busy is not exhausted: a step refused only because
      other steps in flight hold the room waits for them (runs under way first, then first
      come; at most 60 s and never past the deadline); a new run's first step waits until it
      leaves room for one step estimate of each run under way, so work under way finishes
      before new work takes the pool; and a run ends ``tokens_exhausted``
      only when what was spent leaves no room. The step is then charged what the model reports
      (past the limit too: the run then ends ``tokens_exhausted``), or, when it reports nothing
      plausible, the count of the text it was sent and wrote — never the hold. Concurrent runs
      can overshoot a shared token limit by at most each in-flight step's reply beyond its
      estimate.
    - ``answer_margin`` (1): the run's last steps kept for answering. Exploration stops before
      them, the model is told it is its final turn (``DecisionInput.final_turn``) and tool calls
      are refused; the run ends ``step_budget_exhausted`` (code ``answer_margin``) only if it
      does not answer or abstain then. ``0`` turns the margin off.
    - ``repair_attempts`` (1): give an unknown tool or a schema or semantic violation back to the
      model as data (``DecisionInput.repair``: call ids, field paths, rule names — never values)
      up to that many times, each try spending a step; then the run ends ``invalid_proposal``.
      So ``{"order_id": 1002}`` for a string field costs one repair turn, not the run. ``0`` is
      the strict ending: the first such proposal ends the run ``invalid_proposal``.
    - ``denial`` (``"end_run"``): what a capability or semantic denial does. ``"end_run"``
      ends the run (``policy_denied``, ``invalid_proposal``) and nothing of its batch runs;
      ``"observe"`` makes it an observation with a safe code (``permission_denied``,
      ``invalid_argument``) and a ``denied`` receipt, and the run goes on — the denied call never
      runs, and the same call denied past its repeat limit ends the run ``no_progress``
      (:mod:`fencepost.policy.denial`).
    - ``approver`` (``None``): a policy asked first about every call that needs approval (a
      write or external effect), sync or ``async``: given an :class:`~fencepost.policy.approver.
      ApproverInput` (the proposal, its verdict, the trusted context, the run's evidence), it
      returns ``ApproverDecision.approve()``, ``.reject("safe_code")`` or ``.ask()`` (a human,
      by ``approval``'s path). One that raises, hangs past its timeout or returns anything else
      rejects the call (fail closed). Its answers are in the verdicts, the receipts and the
      manifests (:mod:`fencepost.policy.approver`).
    - ``needs_approval`` (``None``): decides per call, for every tool without a
      ``needs_approval`` of its own, whether the call needs approval, from its arguments and
      the trusted context: ``needs_approval(ApprovalQuestion) -> bool``, sync or ``async``. One
      that raises, hangs or answers anything but a bool means the call needs approval
      (:mod:`fencepost.policy.conditional_approval`).
    - ``approval_right`` (``None``: ``approve:<the tool's capability>``): who may answer an
      approval besides the requester. With ``approval="interrupt"`` a resume may come from any
      principal of the run's tenant holding this capability (a tool's own ``approval_right``
      wins); the run keeps the requester's identity, and who answered is in the verdicts,
      receipts (``approved_by``), manifests and spans. An answer from no context, another
      tenant, or a principal without the right is not taken: the run keeps waiting, asking
      again with the refusal's code, and the right person can still answer.
    - ``four_eyes`` (``False``): refuse the requester's own answer (a tool's own ``four_eyes``
      wins): someone else of its tenant holding the right must answer.
    - ``price`` (the model's own ``model_name`` in ``prices``, when there): what the model's
      tokens cost, a :class:`~fencepost.policy.pricing.ModelPrice` or a model name in
      ``prices`` (``GraphConfigError`` naming ``price`` when the table has none: never a
      guess). A priced graph charges each model step on the ``money`` axis as tokens are
      charged (the hold priced, settled to the reported usage priced, cached input at the
      cached price), in integer micro-units; a run whose account chain limits money
      (``RuntimeBudget(money_remaining=...)``, a parent account's ``money`` limit) on an
      unpriced graph ends before its first step, ``policy_denied`` (``money_unpriced``).
    - ``prices`` (``fp.PRICES``, dated ``PRICES.as_of``): the price table ``price`` is looked
      up in; pass your own when it is out of date.
    - ``provenance`` (``"observe"``): the built-in provenance rule
      (:mod:`fencepost.policy.provenance`). A write or external call whose sensitive arguments
      (``@fp.tool(..., sensitive=("recipient",))``) trace only to untrusted tool output (a
      tool's ``output_trust``, untrusted by default) is refused ``untrusted_provenance``
      (``"refuse"``: a policy denial, data under ``denial="observe"``), sent to approval —
      the approver first, if any, then a person (``"ask"``) — or let go on (``"observe"``).
      Whatever the mode, each traced call's provenance (sources by call id and kind, never a
      value) is in its verdict, receipt, manifest and span.

    Example::

        graph = build_agent_graph(registry, ScriptedDecisionModel([...])).compile(
            checkpointer=InMemorySaver()
        )
        out = graph.invoke(start("question", budget), config, context=RunContext(...))
        run_output(out).termination
    """
    priced = _price(model, price, prices)
    return _assemble(
        loop_config(
            registry,
            model,
            approval=approval,
            repeat_limit=repeat_limit,
            ledger=ledger,
            clock=clock,
            model_timeout_seconds=model_timeout_seconds,
            require_citations=require_citations,
            model_retries=model_retries,
            max_concurrent_tools=max_concurrent_tools,
            verdict_key=verdict_key,
            tokens_per_step=tokens_per_step,
            answer_margin=answer_margin,
            repair_attempts=repair_attempts,
            denial=denial,
            approver=approver,
            needs_approval=needs_approval,
            approval_right=approval_right,
            four_eyes=four_eyes,
            price=priced,
            provenance=provenance,
        ),
        twin=ledger is None,
    )


def _price(model: object, price: object, prices: object) -> ModelPrice | None:
    """The price a graph's model steps are charged at: ``price`` itself, the table's row for the
    model ``price`` names, or (no ``price``) the table's row for the model's own name
    (``model_name``) when it has one; ``None``: unpriced. Never a guess: a named model the
    table does not price is refused."""
    if not isinstance(prices, PriceTable):
        raise GraphConfigError("prices", "must be a fp.PriceTable")
    if price is None:
        named = getattr(model, "model_name", None)
        return prices.price_of(named) if isinstance(named, str) and named else None
    if isinstance(price, ModelPrice):
        return price
    if not isinstance(price, str) or not price:
        raise GraphConfigError(
            "price", "must be a model name in the price table or a fp.ModelPrice"
        )
    found = prices.price_of(price)
    if found is None:
        raise GraphConfigError(
            "price",
            f"the price table ({prices.source}, as of {prices.as_of.isoformat()}) has no price "
            f"for model {price!r}: pass price=fp.ModelPrice(input=..., output=...) in "
            f"{prices.currency} per million tokens, or prices=fp.PriceTable(...)",
        )
    return found


def _assemble(cfg: LoopConfig, *, twin: bool = False) -> StateGraph[Any, RunContext, Any, Any]:
    """The loop's ``StateGraph`` over ``cfg``: its nodes, its edges, and (``twin``: a graph
    built with no ledger) the graph it compiles into instead with a checkpointer."""
    # A mapping context is validated by the nodes, not by LangGraph (see ContextInput).
    graph = BoundedStateGraph(GraphState, context_schema=ContextInput, input_schema=InputState)
    # One body per node, run by the sync or the async path (see fencepost.graph.node_io).
    for name, body in (
        ("decide", decide),
        ("execute", execute),
        ("approve", approve),
        ("terminal", terminal),
    ):
        graph.add_node(name, loop_node(cfg, name, body))
    graph.add_conditional_edges(START, route_start, ["decide", "approve", "execute", "terminal"])
    graph.add_conditional_edges(
        "decide", route_after_decide, ["approve", "execute", "decide", "terminal"]
    )
    # "approve" too: a state update made as the approve node while a call still awaits a human.
    graph.add_conditional_edges(
        "approve", route_after_approve, ["approve", "execute", "decide", "terminal"]
    )
    graph.add_conditional_edges("execute", route_after_execute, ["decide", "terminal"])
    # "terminal" too: a state update made as the terminal node is not an ended run.
    graph.add_conditional_edges("terminal", route_after_terminal, ["terminal", END])
    if twin:
        graph.durable_twin = partial(_durable_twin, cfg)
    remember(graph, cfg)
    return graph


def _durable_twin(cfg: LoopConfig, checkpointer: Any) -> StateGraph[Any, Any, Any, Any] | None:
    """The graph a graph built with no ledger compiles into with ``checkpointer``: the same
    loop over the ledger every graph compiled with that checkpointer shares, as durable as its
    checkpoints (``default_ledger``), or ``None`` when there is no saver to share one beside
    (the graph keeps its own in-memory ledger). ``GraphConfigError`` when no such ledger can be
    made."""
    try:
        ledger = durable_ledger(checkpointer)
    except LedgerNeeded as needed:
        raise GraphConfigError("ledger", str(needed)) from None
    if ledger is None:
        return None
    # A saver's in-memory ledger is process-local: its ended runs are forgotten from it too.
    twin = _assemble(replace(cfg, ledger=ledger, owns_ledger=isinstance(ledger, InMemoryLedger)))
    close = getattr(ledger, "close", None)
    if callable(close):
        # Made for this graph alone: its connection goes with the graph, if not before (with
        # the opener of the checkpointer; closing twice is harmless).
        weakref.finalize(twin, close)
    return twin
