"""Tools as trusted configuration: what a tool does, what it may touch, and who may call it."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fencepost.policy.contract import Frozen
from fencepost.policy.deadline import Deadline
from fencepost.policy.decision import TOOL_NAME_PATTERN
from fencepost.policy.effect import Effect as Effect
from fencepost.policy.trust import Trust

if TYPE_CHECKING:
    from fencepost.policy.decision import ToolProposal
    from fencepost.policy.state import AgentState


class Principal(Frozen):
    """The caller a run acts for, and the capabilities it holds. Trusted: never from the model."""

    id: Annotated[str, Field(min_length=1)]
    capabilities: Annotated[frozenset[str], Strict(False)] = frozenset()

    def has(self, capability: str) -> bool:
        """Whether the principal holds ``capability``."""
        return capability in self.capabilities


class ToolContext(Frozen):
    """What a tool may know about its run. Built by the runtime from trusted context only."""

    run_id: str
    tenant_id: str
    principal_id: str
    deadline: Deadline
    """This call's stage deadline: the smaller of the run's remainder and the tool's timeout."""
    idempotency_key: str = ""
    """The call id: the same on every retry and resume of this call, so a write happens once."""
    dependencies: dict[str, JsonValue] = Field(default_factory=dict)
    """What this call may read of the calls it ``depends_on``: by call id, each one's result as
    JSON — for a call that only accepted work, its ``Accepted`` (``{"task_id": ..., "detail":
    {...}}``). Untrusted data, as any tool output. A dependency of the same batch is read as
    its tool returned it; one from an earlier step as the checkpoint holds its observation."""
    attempt: Annotated[int, Field(ge=1)] = 1
    """1 for the first attempt; higher when a crash forced a retry of the same call id."""
    budget_account: str | None = None
    """The calling run's ledger account: a child run started by this tool is opened under it."""
    injected: dict[str, Any] = Field(default_factory=dict, repr=False, exclude=True)
    """The run's injected dependencies (``RunContext.injected``): application objects, by name,
    that a tool takes as a parameter annotated ``Annotated[T, Injected("name")]``. Never shown
    to the model, never checkpointed, never dumped."""


class Injected:
    """Marks a tool parameter as an injected dependency: the caller supplies it, the model never
    sees it. ``Annotated[Bank, Injected("bank")]`` takes ``RunContext.injected["bank"]`` (the
    parameter's own name when none is given); it is no field of the args model and no part of the
    catalog. A run that injects nothing under that name gives the parameter its default, or, with
    none, fails the call (``internal_error``) before its body runs.

    >>> Injected("db").name
    'db'
    """

    __slots__ = ("name",)

    def __init__(self, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError("Injected(name): the name must be a non-empty string")
        self.name = name

    def __repr__(self) -> str:
        return f"Injected({self.name!r})" if self.name is not None else "Injected()"


DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
"""A tool's own time limit when its definition names none (``@tool``, ``ToolSpec``,
``tool_spec`` alike): a call still running then is abandoned and observed as ``timeout``."""

ToolExecute = Callable[[Any, ToolContext], Any]
"""``execute(args, context)``: sync or async; returns a JSON-able value or a pydantic model."""
# The third argument is a ``RunContext | None`` (policy.context imports this module: not named).
SemanticValidator = Callable[[Any, "AgentState"], None] | Callable[[Any, "AgentState", Any], None]
"""Raises :class:`~fencepost.policy.gates.ToolSemanticError` when valid-looking args make no sense.

``validator(args, state)``, or ``validator(args, state, context)`` to be given the run's trusted
:class:`~fencepost.policy.context.RunContext` too (its ``app_data``: known payees, allowed
domains); ``context`` is ``None`` only when a proposal is gated outside a run. Which form is
read from the signature: one that takes a third positional argument gets the context. Either
form that also takes a keyword ``provenance`` is given the
:class:`~fencepost.policy.provenance.Provenance` of the call's arguments (where each value was
seen: the request, the app data, which earlier output), or ``None`` when the call is not
traced in a batch."""
NeedsApproval = Callable[[Any], Any]
"""``needs_approval(question) -> bool`` (sync or ``async``): whether this one call needs approval,
judged from its arguments and the run's trusted context; the ``question`` is a
:class:`~fencepost.policy.conditional_approval.ApprovalQuestion`. Contained as an approver is:
anything but ``True`` or ``False`` in time means it does (see that module)."""
ProgressPredicate = Callable[["ToolProposal", "AgentState"], bool]
"""True when repeating this exact call is still progress (polling a durable task, say)."""


def lax_model_in(annotation: Any) -> str | None:
    """The dotted path of the first pydantic model in ``annotation`` that allows extra keys (a
    field so typed could carry anything the model sends), or ``None``."""
    stack: list[Any] = [annotation]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            bad = _forbids_extra(tp, set())
            if bad:
                return bad
        elif get_origin(tp) is not None or isinstance(tp, types.UnionType):
            stack.extend(get_args(tp))
    return None


def _forbids_extra(model: type[BaseModel], seen: set[type[BaseModel]]) -> str | None:
    """The dotted path of the first model in ``model``'s tree that allows extra keys, if any."""
    if model in seen:
        return None
    seen.add(model)
    if model.model_config.get("extra") != "forbid":
        return model.__name__
    for name, field in model.model_fields.items():
        stack: list[Any] = [field.annotation]
        while stack:
            tp = stack.pop()
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                bad = _forbids_extra(tp, seen)
                if bad:
                    return f"{model.__name__}.{name}->{bad}"
            elif get_origin(tp) is not None or isinstance(tp, types.UnionType):
                stack.extend(get_args(tp))
    return None


class ToolSpec(BaseModel):
    """A registered tool: its schema, effect, required capability, timeout and body.

    ``effect`` and ``capability`` come from trusted configuration; the description only helps
    the model choose. The args model must forbid extra keys all the way down. The keyword names
    are the ones ``@fp.tool`` and ``tool_spec`` take.

    Example::

        class SearchArgs(BaseModel):
            model_config = ConfigDict(extra="forbid", strict=True)
            query: str

        search = ToolSpec(
            name="search_logs", description="Search logs.", args_model=SearchArgs,
            effect=Effect.READ, capability="logs:read", timeout_seconds=5,
            execute=lambda args, ctx: {"hits": []},
        )
    """

    model_config = ConfigDict(
        frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True
    )

    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: Annotated[str, Field(min_length=1, max_length=4_000)]
    args_model: type[BaseModel]
    effect: Annotated[Effect, Strict(False)]
    capability: Annotated[str, Field(min_length=1)]
    """What a principal must hold to call the tool (trusted configuration)."""
    timeout_seconds: Annotated[float, Field(gt=0, le=86_400), Strict(False)] = (
        DEFAULT_TOOL_TIMEOUT_SECONDS
    )
    """The tool's own time limit per call, in seconds (the run's deadline may cut it shorter)."""
    execute: ToolExecute
    semantic_validator: SemanticValidator | None = None
    progress_predicate: ProgressPredicate | None = None
    cost: Annotated[float, Field(ge=0, allow_inf_nan=False), Strict(False)] = 0.0
    """Cost units one call spends, reserved with the call on the budget's ``cost`` axis."""
    completion_evidence: Annotated[tuple[str, ...], Strict(False)] = ()
    """For a status tool: the evidence fields a returned ``Completed`` must carry (non-empty) to
    turn the accepted task it names ``completed``. Empty: this tool completes no task."""
    evidence_for: Annotated[tuple[str, ...], Strict(False)] = ()
    """For a status tool: the accepting tools whose tasks its ``Completed`` is evidence for
    (``("upload_document",)``). A task is completed only by a status tool declared for the tool
    that accepted it, and only by a check made after the acceptance (a later step, or a call of
    the same batch that ``depends_on`` the accepting one). Required with
    ``completion_evidence``, and checked when the registry is built: every name registered."""
    poll_interval_seconds: Annotated[float | None, Field(gt=0), Strict(False)] = None
    """For a polling tool: the same call repeated this long after the last one is progress
    whatever it returns; sooner is no progress."""
    idempotent: bool | None = None
    """Whether a retry after a crash is safe. Defaults to True for reads, False otherwise; a write
    that honours ``ToolContext.idempotency_key`` may set True."""
    allow_empty_query: bool = False
    """Turn the built-in empty-query rule off for this tool: its query-like field (``query``,
    ``q``, ``search``...) may be ``""`` or ``"*"``, as for a search that filters by another
    argument (a sender, a date). The reversed-range rule and ``semantic_validator`` still apply."""
    needs_approval: NeedsApproval | None = None
    """Whether each call needs approval, decided per call (:data:`NeedsApproval`); ``None``:
    exactly the calls of a ``write`` or ``external`` tool do. It may ask approval of a read,
    or let a write run unasked (then the executor runs this tool's writes on the gate's
    verdict in every approval mode: seal verdicts with ``verdict_key``)."""
    repeat_limit: Annotated[int | None, Field(ge=1)] = None
    """This tool's own repeat limit: how often the same call (same arguments, same last
    result) may be allowed before the run ends ``no_progress``. ``None``: the graph's
    ``repeat_limit``. Three equal transfers may be legitimate (``repeat_limit=3``)."""
    approval_right: Annotated[str | None, Field(min_length=1)] = None
    """The capability a principal other than the requester must hold to answer this tool's
    approval. ``None``: the graph's ``approval_right``, else ``approve:<capability>``
    (``approve:notes:write`` for a ``notes:write`` tool)."""
    four_eyes: bool | None = None
    """``True``: the requester's own answer to this tool's approval is refused (someone else
    of the run's tenant holding the approval right must answer). ``None``: the graph's
    ``four_eyes``."""

    output_trust: Annotated[Trust, Strict(False)] = Trust.UNTRUSTED
    """Whether this tool's output is trusted: a system of record the application controls
    (``Trust.TRUSTED``), or content others may write — mail, messages, web pages, shared files,
    transaction descriptions (``Trust.UNTRUSTED``, the default). A value seen only in untrusted
    output is not the user's (:mod:`fencepost.policy.provenance`)."""
    sensitive: Annotated[tuple[str, ...], Strict(False)] = ()
    """The top-level arguments whose values must not come only from untrusted output (a
    recipient, a URL, an amount, a file, an audience): the graph's ``provenance`` rule judges
    a write or external call by them. Each must be a field of ``args_model``."""

    @field_validator("args_model")
    @classmethod
    def _strict_args(cls, model: type[BaseModel]) -> type[BaseModel]:
        bad = _forbids_extra(model, set())
        if bad:
            raise ValueError(f"args_model must forbid extra keys (extra='forbid'); {bad} does not")
        return model

    @field_validator("sensitive")
    @classmethod
    def _sensitive_are_arguments(
        cls, names: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        model = info.data.get("args_model")
        fields = (
            model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else {}
        )
        unknown = [n for n in names if n not in fields]
        if unknown:
            raise ValueError(f"{unknown} are not arguments of the tool")
        return names

    @model_validator(mode="after")
    def _default_idempotent(self) -> ToolSpec:
        if self.idempotent is None:
            object.__setattr__(self, "idempotent", self.effect is Effect.READ)
        return self

    @property
    def retry_safe(self) -> bool:
        """Whether a call of this tool may be run again after an attempt of unknown outcome."""
        return bool(self.idempotent)
