"""The loop's settings: :class:`LoopSettings`, the one typed object every binding takes.

``create_agent``, ``build_agent_graph`` and ``FencepostMiddleware`` take ``settings=`` (keyword
arguments of the same names build one); each setting's default, check and meaning are written
once, here. :class:`LoopConfig` is those settings resolved for one registry and one model — what
the nodes read. A new setting is a field of :class:`LoopSettings` and a key of
:class:`LoopOptions`, nothing else.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict, TypeVar

from langgraph.graph import StateGraph

from fencepost.graph.token_count import text_counter
from fencepost.policy import (
    DEFAULT_REPEAT_LIMIT,
    Clock,
    DecisionModel,
    InMemoryLedger,
    Ledger,
    SystemClock,
    ToolRegistry,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver
from fencepost.policy.denial import DENIAL_MODES, DenialMode
from fencepost.policy.pricing import PRICES, ModelPrice, PriceTable
from fencepost.policy.provenance import PROVENANCE_MODES, ProvenanceMode
from fencepost.policy.registry import TOOL_CATALOGS, ToolCatalog
from fencepost.policy.repair import DEFAULT_REPAIR_ATTEMPTS
from fencepost.policy.tool import NeedsApproval

T = TypeVar("T")
Update = dict[str, Any]


class GraphConfigError(ValueError):
    """``build_agent_graph`` was given a bad setting, or the graph was compiled or invoked in a
    way it cannot run (an approval no checkpointer could resume, a sync saver under
    ``ainvoke``); the message names the field and the public fix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


NO_CHECKPOINTER = (
    "approval='interrupt' pauses a run that only a checkpointer can resume: pass one, "
    "fp.create_agent(..., checkpointer=...) or graph.compile(checkpointer=...)"
)

SYNC_SAVER = (
    "{saver} has no async methods, and ainvoke/astream need them: open the checkpointer with "
    "`async with fp.aopen_checkpointer(url) as saver` and compile with that saver"
)


def _count(value: object, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSettings:
    """The loop's settings, each with its default, checked when made (:class:`GraphConfigError`
    naming the field given a bad value).

    ``fp.create_agent(model, tools, settings=fp.LoopSettings(approval="interrupt"))`` is the same
    agent as ``fp.create_agent(model, tools, approval="interrupt")``; one settings object may be
    shared by many agents. Given both, a keyword argument wins over the object's field
    (``settings=base, approval="interrupt"`` is ``base`` with that one field changed).

    Example::

        strict = fp.LoopSettings(repair_attempts=0, require_citations=True)
        agent = fp.create_agent(model, tools, settings=strict, checkpointer=saver)
    """

    approval: ApprovalMode = "terminate"
    """``"terminate"`` ends a run that proposes a write/external effect as
    ``approval_required``; ``"interrupt"`` pauses it with LangGraph ``interrupt()`` until the
    caller resumes with ``Command(resume="approve" | "reject" | {"decision": "edit", ...})``."""
    repeat_limit: int = DEFAULT_REPEAT_LIMIT
    """How many times the same call (same tool, same canonical arguments, same result) may repeat
    before the run ends ``no_progress``, before anything is spent."""
    ledger: Ledger | None = None
    """The one budget truth (``None``: one as durable as the checkpointer the graph is
    compiled with, picked by ``build_agent_graph``). Every step, tool call, token, cost unit and
    mutation is reserved there before it is spent, and the state's ``budget`` is its view; a
    run's limits and owner are the ledger's, never read back from state. Without one, every graph
    compiled with the same checkpointer shares one ledger: in memory beside an ``InMemorySaver``
    (one per saver object, so an agent built per request on one saver keeps one budget truth), in
    the same SQLite file beside a ``SqliteSaver``, in the same store beside one
    ``open_checkpointer`` opened; any other checkpointer is refused at compile
    (``GraphConfigError`` naming the ledger to pass). Compiled with no checkpointer of its own
    (nested in a graph of yours), the graph keeps an in-memory ledger of its own: build it once,
    or pass one. A ledger that holds no account of a run it is asked to resume (a fresh
    ``InMemoryLedger``, one lost with its process) refuses it: the run ends ``policy_denied``
    (``unknown_budget_account``) and nothing it paused runs. A durable ledger (SQLite/Postgres)
    makes reservations survive a crash mid-call, so a retried step or call is charged once per
    attempt and an uncertain write is reported as such, and it enforces limits across
    processes."""
    clock: Clock | None = None
    """What deadlines are measured with (``None``: the system clock; a fake one in tests)."""
    model_timeout_seconds: float = 120.0
    """The longest one model step may take, inside the run's deadline; a step past it is a
    ``timeout`` model error."""
    require_citations: bool = False
    """Refuse a final answer that cites no evidence (a chat model's plain-text reply, or
    ``citations=[]``); by default it completes."""
    model_retries: int = 2
    """A retryable model error (``rate_limited``, ``unavailable``, ``timeout``) is asked again at
    the next step, up to this many times in a row; each retry spends its own step."""
    max_concurrent_tools: int = 8
    """A batch of tool calls runs concurrently, at most this many at a time."""
    verdict_key: bytes | None = None
    """A secret the caller keeps, the same for every process serving the graph. The gate seals
    each allowed verdict with it and the executor runs only sealed ones: a verdict written into
    the checkpoint by anyone else (``update_state``, a database edit) never runs."""
    tokens_per_step: int | None = None
    """The model's output cap (``None``: the model's own ``token_estimate``;
    ``ChatModelDecider`` takes it from the chat model's ``max_tokens``). A model step holds a
    bounded estimate before the model is called — the input it is about to send, counted (by
    ``tiktoken`` when it is installed and loads, else at four characters a token), plus this cap
    (4,096 when neither gives one) — capped at what the run and its parent accounts have not
    spent; never all that is left. Busy is not exhausted: a step refused only because other
    steps in flight hold the room waits for them (runs under way first, then first come; at most
    60 s and never past the deadline); a new run's first step waits until it leaves room for one
    step estimate of each run under way, so work under way finishes before new work takes the
    pool; and a run ends ``tokens_exhausted`` only when what was spent leaves no room. The step
    is then charged what the model reports (past the limit too: the run then ends
    ``tokens_exhausted``), or, when it reports nothing plausible, the count of the text it was
    sent and wrote — never the hold. Concurrent runs can overshoot a shared token limit by at
    most each in-flight step's reply beyond its estimate."""
    answer_margin: int = 1
    """The run's last steps kept for answering. Exploration stops before them, the model is told
    it is its final turn (``DecisionInput.final_turn``) and tool calls are refused; the run ends
    ``step_budget_exhausted`` (code ``answer_margin``) only if it does not answer or abstain
    then. ``0`` turns the margin off."""
    repair_attempts: int = DEFAULT_REPAIR_ATTEMPTS
    """Give an unknown tool or a schema or semantic violation back to the model as data
    (``DecisionInput.repair``: call ids, field paths, rule names — never values) up to that many
    times, each try spending a step; then the run ends ``invalid_proposal``. So
    ``{"order_id": 1002}`` for a string field costs one repair turn, not the run. ``0`` is the
    strict ending: the first such proposal ends the run ``invalid_proposal``."""
    denial: DenialMode = "end_run"
    """What a capability or semantic denial does. ``"end_run"`` ends the run (``policy_denied``,
    ``invalid_proposal``) and nothing of its batch runs; ``"observe"`` makes it an observation
    with a safe code (``permission_denied``, ``invalid_argument``) and a ``denied`` receipt, and
    the run goes on — the denied call never runs, and the same call denied past its repeat limit
    ends the run ``no_progress`` (:mod:`fencepost.policy.denial`)."""
    approver: Approver | None = None
    """A policy asked first about every call that needs approval (a write or external effect),
    sync or ``async``: given an :class:`~fencepost.policy.approver.ApproverInput` (the proposal,
    its verdict, the trusted context, the run's evidence), it returns
    ``ApproverDecision.approve()``, ``.reject("safe_code")`` or ``.ask()`` (a human, by
    ``approval``'s path). One that raises, hangs past its timeout or returns anything else
    rejects the call (fail closed). Its answers are in the verdicts, the receipts and the
    manifests (:mod:`fencepost.policy.approver`)."""
    needs_approval: NeedsApproval | None = None
    """Decides per call, for every tool without a ``needs_approval`` of its own, whether the call
    needs approval, from its arguments and the trusted context:
    ``needs_approval(ApprovalQuestion) -> bool``, sync or ``async``. One that raises, hangs or
    answers anything but a bool means the call needs approval
    (:mod:`fencepost.policy.conditional_approval`)."""
    approval_right: str | None = None
    """Who may answer an approval besides the requester (``None``: ``approve:<the tool's
    capability>``). With ``approval="interrupt"`` a resume may come from any principal of the
    run's tenant holding this capability (a tool's own ``approval_right`` wins); the run keeps
    the requester's identity, and who answered is in the verdicts, receipts (``approved_by``),
    manifests and spans. An answer from no context, another tenant, or a principal without the
    right is not taken: the run keeps waiting, asking again with the refusal's code, and the
    right person can still answer."""
    four_eyes: bool = False
    """Refuse the requester's own answer (a tool's own ``four_eyes`` wins): someone else of its
    tenant holding the right must answer."""
    price: str | ModelPrice | None = None
    """What the model's tokens cost: a :class:`~fencepost.policy.pricing.ModelPrice` or a model
    name in ``prices`` (``GraphConfigError`` naming ``price`` when the table has none: never a
    guess); ``None``: the model's own ``model_name`` in ``prices``, when there, else unpriced. A
    priced graph charges each model step on the ``money`` axis as tokens are charged (the hold
    priced, settled to the reported usage priced, cached input at the cached price), in integer
    micro-units; a run whose account chain limits money (``RuntimeBudget(money_remaining=...)``,
    a parent account's ``money`` limit) on an unpriced graph ends before its first step,
    ``policy_denied`` (``money_unpriced``)."""
    prices: PriceTable = PRICES
    """The price table ``price`` is looked up in (``fp.PRICES``, dated ``PRICES.as_of``); pass
    your own when it is out of date."""
    tool_catalog: ToolCatalog = "all"
    """Which tools the model is shown: ``"all"``, or ``"permitted"`` — only those the run's
    principal may call, by the gate's own capability check, each step
    (:mod:`fencepost.policy.registry`). The gate still refuses a call to a tool not shown."""
    provenance: ProvenanceMode = "observe"
    """The built-in provenance rule (:mod:`fencepost.policy.provenance`): a write or external
    call whose sensitive arguments (``@fp.tool(..., sensitive=("recipient",))``) trace only to
    untrusted tool output (a tool's ``output_trust``, untrusted by default) is refused
    ``untrusted_provenance`` (``"refuse"``: a policy denial, data under ``denial="observe"``),
    sent to approval — the approver first, if any, then a person (``"ask"``) — or let go on
    (``"observe"``). Whatever the mode, each traced call's provenance (sources by call id and
    kind, never a value) is in its verdict, receipt, manifest and span."""

    def __post_init__(self) -> None:
        if self.approval not in ("terminate", "interrupt"):
            raise GraphConfigError("approval", "must be 'terminate' or 'interrupt'")
        if not _count(self.repeat_limit, 1):
            raise GraphConfigError("repeat_limit", "must be an integer >= 1")
        if self.ledger is not None and not isinstance(self.ledger, Ledger):
            raise GraphConfigError("ledger", "must be a fencepost Ledger")
        if not _count(self.model_retries, 0):
            raise GraphConfigError("model_retries", "must be an integer >= 0")
        if not _count(self.max_concurrent_tools, 1):
            raise GraphConfigError("max_concurrent_tools", "must be an integer >= 1")
        key = self.verdict_key
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise GraphConfigError("verdict_key", "must be bytes, at least 16 of them")
        timeout = self.model_timeout_seconds
        if not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and timeout > 0
            and math.isfinite(timeout)
        ):
            # An infinite timeout has no deadline to compute: it failed at the first model step.
            raise GraphConfigError("model_timeout_seconds", "must be > 0 and finite")
        if not _count(self.repair_attempts, 0):
            raise GraphConfigError("repair_attempts", "must be an integer >= 0")
        if not _count(self.answer_margin, 0):
            raise GraphConfigError("answer_margin", "must be an integer >= 0")
        if self.denial not in DENIAL_MODES:
            raise GraphConfigError("denial", "must be 'end_run' or 'observe'")
        if self.approver is not None and not callable(self.approver):
            raise GraphConfigError(
                "approver", "must be callable: approver(ApproverInput) -> ApproverDecision"
            )
        if self.needs_approval is not None and not callable(self.needs_approval):
            raise GraphConfigError(
                "needs_approval", "must be callable: needs_approval(ApprovalQuestion) -> bool"
            )
        right = self.approval_right
        if right is not None and (not isinstance(right, str) or not right):
            raise GraphConfigError("approval_right", "must be a non-empty capability name")
        if not isinstance(self.four_eyes, bool):
            raise GraphConfigError("four_eyes", "must be True or False")
        if self.tokens_per_step is not None and not _count(self.tokens_per_step, 0):
            raise GraphConfigError("tokens_per_step", "must be an integer >= 0")
        if self.tool_catalog not in TOOL_CATALOGS:
            raise GraphConfigError("tool_catalog", "must be 'all' or 'permitted'")
        if self.provenance not in PROVENANCE_MODES:
            raise GraphConfigError("provenance", "must be 'observe', 'ask' or 'refuse'")
        if not isinstance(self.prices, PriceTable):
            raise GraphConfigError("prices", "must be a fp.PriceTable")
        if isinstance(self.price, str) and self.price:
            self._named_price(self.price)
        elif self.price is not None and not isinstance(self.price, ModelPrice):
            raise GraphConfigError(
                "price", "must be a model name in the price table or a fp.ModelPrice"
            )

    def _named_price(self, name: str) -> ModelPrice:
        """The table's price of model ``name``; never a guess: a name it lacks is refused."""
        found = self.prices.price_of(name)
        if found is None:
            prices = self.prices
            raise GraphConfigError(
                "price",
                f"the price table ({prices.source}, as of {prices.as_of.isoformat()}) has no "
                f"price for model {name!r}: pass price=fp.ModelPrice(input=..., output=...) in "
                f"{prices.currency} per million tokens, or prices=fp.PriceTable(...)",
            )
        return found

    def price_for(self, model: object) -> ModelPrice | None:
        """The price ``model``'s steps are charged at: ``price`` itself, the table's row for the
        model ``price`` names, or (no ``price``) the table's row for the model's own name
        (``model_name``) when it has one; ``None``: unpriced."""
        if isinstance(self.price, ModelPrice):
            return self.price
        if isinstance(self.price, str):
            return self._named_price(self.price)
        named = getattr(model, "model_name", None)
        return self.prices.price_of(named) if isinstance(named, str) and named else None


class LoopOptions(TypedDict, total=False):
    """The keyword arguments that build a :class:`LoopSettings`: one key per field, the same
    name and type (what ``create_agent(..., **options)`` accepts)."""

    approval: ApprovalMode
    repeat_limit: int
    ledger: Ledger | None
    clock: Clock | None
    model_timeout_seconds: float
    require_citations: bool
    model_retries: int
    max_concurrent_tools: int
    verdict_key: bytes | None
    tokens_per_step: int | None
    answer_margin: int
    repair_attempts: int
    denial: DenialMode
    approver: Approver | None
    needs_approval: NeedsApproval | None
    approval_right: str | None
    four_eyes: bool
    price: str | ModelPrice | None
    prices: PriceTable
    tool_catalog: ToolCatalog
    provenance: ProvenanceMode


def settings_from(settings: LoopSettings | None, options: LoopOptions) -> LoopSettings:
    """The settings a binding was given: ``settings`` (default ones without it) with each
    keyword argument in ``options`` in place of its field — the keyword wins."""
    if settings is None:
        return LoopSettings(**options)
    if not isinstance(settings, LoopSettings):
        raise GraphConfigError("settings", "must be an fp.LoopSettings")
    return replace(settings, **options) if options else settings


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopConfig(LoopSettings):
    """The settings resolved for one registry and one model: what the nodes read (every
    :class:`LoopSettings` field, with the ones left to a default made concrete)."""

    registry: ToolRegistry
    model: DecisionModel
    ledger: Ledger
    clock: Clock
    tokens_per_step: int
    """Tokens a model step reserves before the model is called (settled to what it reports)."""
    price: ModelPrice | None
    owns_ledger: bool = False
    """The ledger is an in-memory one fencepost made (none was passed): the graph's own, or its
    saver's (``default_ledger.in_memory_ledger``). Runs that end are forgotten from it."""

    @classmethod
    def of(cls, registry: ToolRegistry, model: DecisionModel, settings: LoopSettings) -> LoopConfig:
        """``settings`` resolved for ``registry`` and ``model`` (each checked:
        ``GraphConfigError`` naming the field)."""
        if not isinstance(registry, ToolRegistry):
            raise GraphConfigError("registry", "must be a ToolRegistry")
        if not callable(getattr(model, "decide", None)):
            raise GraphConfigError(
                "model", "must implement DecisionModel.decide(input, *, deadline)"
            )
        tokens = settings.tokens_per_step
        if tokens is None:
            declared = getattr(model, "token_estimate", None)
            tokens = declared if isinstance(declared, int) and declared > 0 else 0
        text_counter()  # chosen (a tokenizer loaded) now, never while a node runs
        given = {f.name: getattr(settings, f.name) for f in fields(LoopSettings)}
        given.update(
            ledger=settings.ledger if settings.ledger is not None else InMemoryLedger(),
            clock=settings.clock or SystemClock(),
            tokens_per_step=tokens,
            price=settings.price_for(model),
        )
        return cls(registry=registry, model=model, owns_ledger=settings.ledger is None, **given)


# The settings of each built graph, found again from the graph object (never from a name a
# caller chooses): ``cancel`` uses it to reach the run's ledger account from any thread.
_BUILT: weakref.WeakKeyDictionary[StateGraph[Any, Any, Any, Any], LoopConfig] = (
    weakref.WeakKeyDictionary()
)


def remember(graph: StateGraph[Any, Any, Any, Any], cfg: LoopConfig) -> None:
    """Record the settings a graph was built with."""
    _BUILT[graph] = cfg


def settings_of(graph: object) -> LoopConfig | None:
    """The settings of a graph ``build_agent_graph`` built (compiled or not), if it is one."""
    builder = getattr(graph, "builder", graph)
    if not isinstance(builder, StateGraph):
        return None
    return _BUILT.get(builder)
