"""The per-step trace manifest: what happened, with no prompt, argument or result text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, NamedTuple, get_args

from pydantic import Field, Strict

from fencepost.policy.budget import RuntimeBudget
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.decision import DecisionKind
from fencepost.policy.effect import Effect
from fencepost.policy.phase import Phase
from fencepost.policy.value_source import Recorded
from fencepost.policy.verdict import VerdictCode

Outcome = Literal[
    "decided",
    "allowed",
    "denied",
    "success",
    "error",
    "uncertain",
    "approval_pending",
    "terminal",
]


class StepManifest(Frozen):
    """One node's record for the trace and for eval. Safe to log: it holds no payload text."""

    run_id: str
    step: Annotated[int, Field(ge=0)]
    """The model step this record belongs to (1-based; 0 before the first decision)."""
    phase: Annotated[Phase, Strict(False)]
    decision_kind: DecisionKind | None = None
    tool_name: str | None = None
    effect: Annotated[Effect | None, Strict(False)] = None
    verdict: Annotated[VerdictCode | None, Strict(False)] = None
    steps_remaining: int
    tool_calls_remaining: int
    tokens_used: int = 0
    deadline_remaining_ms: int | None = None
    outcome: Outcome
    code: str | None = None
    """A safe code: the error code, verdict code or termination reason for this record."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    approval: Literal["approver", "human"] | None = None
    """Who answered this call's approval, on the record of the answer: the approver policy or
    a human."""
    approved_by: str | None = None
    """With ``approval="human"``: the id of the principal who answered."""
    provenance: Annotated[Recorded | None, Strict(False)] = None
    """On a gated call's record: where its argument values were seen, per argument, as the
    sources' labels (``{"recipient": ["tool:call_3"]}``) — by call id and kind, never a value.
    ``None``: not traced (see :func:`fencepost.policy.provenance.traced`)."""


def verdict_outcome(code: VerdictCode) -> Outcome:
    """A gated or answered call's record: ``allowed``, ``approval_pending`` (waiting for a
    human), or ``denied`` (every other verdict)."""
    if code is VerdictCode.ALLOWED:
        return "allowed"
    if code is VerdictCode.APPROVAL_PENDING:
        return "approval_pending"
    return "denied"


# -- a step's manifests, assembled from checked values ------------------------------------------


class _ManifestLayout:
    """A plain object whose attributes are a manifest's fields: its ``__dict__`` is a
    split-table dict (keys shared by every instance), see :data:`MANIFEST_DEFAULTS`."""


def _split_table(values: dict[str, Any]) -> dict[str, Any]:
    layout = _ManifestLayout()
    for name, value in values.items():
        setattr(layout, name, value)
    return layout.__dict__


MANIFEST_DEFAULTS: dict[str, Any] = _split_table(
    {
        name: None if info.is_required() else info.get_default(call_default_factory=True)
        for name, info in StepManifest.model_fields.items()
    }
)
"""Every field of a manifest in declared order, at its default (the required ones ``None``,
always given): what a step's manifests are made from. A split-table dict: a copy of it (and
assignments to the fields it has) stays one, holding only its values (296 bytes, where a dict of
its own 18 keys takes 464), and a manifest is kept for as long as its run is. Never changed."""
SHARED_FIELDS = frozenset(
    (
        "run_id",
        "step",
        "phase",
        "steps_remaining",
        "tool_calls_remaining",
        "tokens_used",
        "deadline_remaining_ms",
        "outcome",
    )
)
"""The fields every manifest is given (:func:`manifest_base`, and its outcome): the run, the
step, the budget and time left."""
_OPTIONAL = frozenset(MANIFEST_DEFAULTS) - SHARED_FIELDS
_CALL = frozenset(("decision_kind", "tool_name", "effect", "verdict"))
_GIVEN: dict[frozenset[str], frozenset[str]] = {}
"""The fields set of a manifest given each set of optional field names (fencepost's own
call sites name a handful): validation records the names given, defaults aside."""


class ManifestBase(NamedTuple):
    """What every manifest of one node's step shares (the run, the step, the phase, the
    budget and the time left), made once per step (:func:`manifest_base`).

    A named tuple: made once per step."""

    values: dict[str, Any]
    """Every field of a manifest in declared order: the shared ones set, the rest at their
    default. Copied for each manifest, never changed."""
    checked: bool
    """Whether each shared value is of its field's type, as validation checks it. A state a
    caller wrote may hold another (a budget view assembled by hand, a step that is no count):
    each manifest of such a step is validated instead, and refused."""


def manifest_base(
    run_id: str,
    step: int,
    budget: RuntimeBudget,
    phase: Phase,
    deadline_remaining_ms: int | None,
) -> ManifestBase:
    """The values every manifest of this step (``step`` of run ``run_id``, its ``budget`` view)
    shares, in ``phase``, with ``deadline_remaining_ms`` left (``None``: the run has no
    deadline). Read from a state as it is: a caller may have written it."""
    steps, calls, used = budget.steps_remaining, budget.tool_calls_remaining, budget.tokens_used
    values = MANIFEST_DEFAULTS.copy()
    values["run_id"] = run_id
    values["step"] = step
    values["phase"] = phase
    values["steps_remaining"] = steps
    values["tool_calls_remaining"] = calls
    values["tokens_used"] = used
    values["deadline_remaining_ms"] = deadline_remaining_ms
    checked = (
        type(run_id) is str
        and type(step) is type(steps) is type(calls) is type(used) is int
        and step >= 0
        and (deadline_remaining_ms is None or type(deadline_remaining_ms) is int)
    )
    return ManifestBase(values, checked)


def step_manifest(base: ManifestBase, outcome: Outcome, fields: Mapping[str, Any]) -> StepManifest:
    """One manifest of the step: ``base``'s shared values, ``outcome``, and ``fields`` (values
    of its optional fields that are already checked: fencepost's own codes, a registered tool's
    effect, a judged usage report), assembled as validation would make it."""
    values = base.values.copy()
    values["outcome"] = outcome
    values.update(fields)
    return _made(base, values, fields.keys())


def call_manifest(
    base: ManifestBase,
    outcome: Outcome,
    tool_name: str | None,
    effect: Effect | None,
    verdict: VerdictCode,
    fields: Mapping[str, Any],
) -> StepManifest:
    """The manifest of a gated call: its registered tool's name and effect (``None`` for a
    name the registry does not hold) and ``verdict``, with ``fields`` as
    :func:`step_manifest` takes them."""
    values = base.values.copy()
    values["decision_kind"] = "tool"
    values["tool_name"] = tool_name
    values["effect"] = effect
    values["verdict"] = verdict
    values["outcome"] = outcome
    if not fields:
        return _made(base, values, _CALL)
    values.update(fields)
    return _made(base, values, _CALL | fields.keys())


def _made(base: ManifestBase, values: dict[str, Any], names: Any) -> StepManifest:
    key = names if type(names) is frozenset else frozenset(names)
    given = _GIVEN.get(key)
    if given is None and key <= _OPTIONAL:
        given = _GIVEN[key] = SHARED_FIELDS | key
    if given is None or not base.checked or values["outcome"] not in _OUTCOMES:
        # A key no manifest has, a shared value of another type or an outcome no manifest
        # has: judged, and refused, by validation (given what was given, defaults aside).
        return StepManifest.model_validate({name: values[name] for name in _given(values, key)})
    return assemble(StepManifest, values, given)


def _given(values: Mapping[str, Any], names: frozenset[str]) -> list[str]:
    return [name for name in values if name in SHARED_FIELDS or name in names]


_OUTCOMES = frozenset(get_args(Outcome))
