"""The gates a proposal passes before it may run, each its own function with a typed failure.

Order: registry -> strict schema -> semantic rules -> no-progress -> authorization and effect.
Budget reservation comes last and lives in :mod:`fencepost.policy.budget`.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from fencepost.policy.cancellation import cancelled_by_caller
from fencepost.policy.context import RunContext
from fencepost.policy.contract import assemble
from fencepost.policy.decision import ToolProposal
from fencepost.policy.developer_log import GATE, raised
from fencepost.policy.fingerprint import canonical_json, fingerprint_of, proposal_fingerprint
from fencepost.policy.progress import last_run_at, repeat_key
from fencepost.policy.provenance import Provenance, traced
from fencepost.policy.registry import ToolRegistry, UnknownTool
from fencepost.policy.rule_runner import RULE_TIMEOUT, RuleRunner, RuleTimedOut, run_directly
from fencepost.policy.state import AgentState
from fencepost.policy.stop_report import SAFE_CODE
from fencepost.policy.tool import Effect, Principal, ToolSpec
from fencepost.policy.verdict import Verdict, VerdictCode

DEFAULT_REPEAT_LIMIT = 2


class ToolSemanticError(ValueError):
    """Arguments that pass the schema but make no sense (empty-like query, reversed range...).

    ``rule`` names the rule as a safe code (``^[a-z][a-z0-9_]{0,63}$``: ``unknown_payee``), never
    a sentence about the arguments: the verdict, the receipt, the step's manifest and the stream
    record it. A rule that is no safe code is recorded as :data:`UNNAMED_RULE`, its text logged
    on ``fencepost.gate`` only; the call is refused all the same.
    """

    code = "invalid_tool_semantics"

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


UNNAMED_RULE = "unnamed_rule"
"""What a :class:`ToolSemanticError` whose rule is no safe code is recorded as."""
_SAFE_RULE = re.compile(SAFE_CODE)


class NoProgressDetected(Exception):
    """The same tool with the same canonical arguments was proposed past the repeat limit."""

    code = "no_progress_detected"

    def __init__(self, fingerprint: str) -> None:
        super().__init__(fingerprint)
        self.fingerprint = fingerprint


class ToolPolicyDenied(Exception):
    """The trusted principal lacks the tool's required capability (``capability``)."""

    code = "tool_policy_denied"

    def __init__(self, tool: str, capability: str | None = None) -> None:
        super().__init__(tool)
        self.capability = capability
        """The capability the principal lacks: the registered tool's, from trusted config."""


class HumanApprovalRequired(Exception):
    """A write or external effect needs a human's approval before it may run."""

    code = "human_approval_required"


def check_registered(registry: ToolRegistry, proposal: ToolProposal) -> ToolSpec:
    """Gate 1: the tool must be in the allowlist. Raises :class:`UnknownTool`."""
    return registry.get(proposal.tool_name)


class ArgumentsValidatorFailed(Exception):
    """An arguments model's own code raised what pydantic does not wrap in a ``ValidationError``
    (a ``KeyError`` from a lookup of the model's value, a ``TypeError``, a ``BaseException``,
    its own ``CancelledError``: only the caller's cancellation propagates, see
    :mod:`fencepost.policy.cancellation`).

    A schema refusal like any other; its text (which may quote the model's arguments) is never
    kept, and neither is the exception it stands for (raised outside its handler, so not even
    as a ``__context__``): that one is logged, with its traceback, on ``fencepost.gate``."""

    code = "args_validator_failed"

    def __init__(self) -> None:
        super().__init__("the arguments model's validator failed")


def check_schema(
    spec: ToolSpec,
    proposal: ToolProposal,
    *,
    canonical_arguments: str | None = None,
    run_id: str | None = None,
) -> BaseModel:
    """Gate 2: strict schema, no coercion, no extra keys. Raises pydantic ``ValidationError``,
    or :class:`ArgumentsValidatorFailed` when the model's own validator broke otherwise (what it
    raised is logged with its traceback on ``fencepost.gate``, under ``run_id``).

    Validated as the JSON it is (strict JSON mode): ``"5"`` is still not an int, but a date given
    as ISO text, a tuple as a list and an enum as its value are accepted, as JSON has no others.
    ``canonical_arguments`` is ``canonical_json(proposal.arguments)`` when the caller has it.
    """
    if canonical_arguments is None:
        canonical_arguments = canonical_json(proposal.arguments)
    return _validated(spec, tool_gate(spec), proposal, canonical_arguments, run_id)


def _validated(
    spec: ToolSpec,
    gate: ToolGate,
    proposal: ToolProposal,
    canonical_arguments: str,
    run_id: str | None,
) -> BaseModel:
    """:func:`check_schema` with the tool's gate in hand."""
    model = spec.args_model
    try:
        if gate.pydantic_json:
            # What pydantic's own model_validate_json calls, without its wrapper (a third of the
            # check); a model that overrides model_validate_json is validated through its own.
            args: BaseModel = model.__pydantic_validator__.validate_json(
                canonical_arguments, strict=True
            )
            return args
        return model.model_validate_json(canonical_arguments, strict=True)
    except ValidationError:
        raise
    except BaseException as exc:
        if cancelled_by_caller(exc):
            raise
        # A validator that breaks is a refusal, not a crash (as a semantic validator's is); its
        # traceback is the developer's, in the log only.
        raised(
            GATE,
            f"the arguments validator of {spec.name!r}",
            exc,
            run_id=run_id,
            call_id=proposal.call_id,
            code=ArgumentsValidatorFailed.code,
        )
    raise ArgumentsValidatorFailed


_VALIDATE_JSON = BaseModel.model_validate_json.__func__  # type: ignore[attr-defined]


_EMPTY_LIKE = frozenset({"", "*", "?", "null", "none", "undefined", "n/a", "na", "nil", "''", '""'})
_QUERY_FIELDS = ("query", "q", "search", "search_query", "text", "keywords")
_RANGE_PAIRS = (
    ("start", "end"),
    ("since", "until"),
    ("from_date", "to_date"),
    ("start_date", "end_date"),
    ("start_time", "end_time"),
    ("date_from", "date_to"),
    ("after", "before"),
)


def _is_empty_like(value: str) -> bool:
    return value.strip().strip("'\"").strip().lower() in _EMPTY_LIKE


_Plan = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]
# Per arguments model, which built-in rules can apply to it: most tools have one query-like field
# and no range, and the gate runs on every proposal. Weak keys: a model made per request goes.
_PLANS: weakref.WeakKeyDictionary[type[BaseModel], _Plan] = weakref.WeakKeyDictionary()


def _semantic_plan(model: type[BaseModel]) -> _Plan:
    plan = _PLANS.get(model)
    if plan is None:
        # A validated instance's __dict__ holds its declared fields only (extras live apart).
        names = model.model_fields
        plan = _PLANS[model] = (
            tuple(n for n in _QUERY_FIELDS if n in names),
            tuple((lo, hi) for lo, hi in _RANGE_PAIRS if lo in names and hi in names),
        )
    return plan


def takes_context(rule: Callable[..., Any]) -> bool:
    """Whether a rule (a semantic validator) takes a third positional argument: the trusted
    :class:`RunContext`. Read from its signature once per rule; one whose signature cannot be
    read is given the two arguments every rule takes."""
    try:
        return _TAKES_CONTEXT[rule]
    except (KeyError, TypeError):
        pass
    # A rule that also takes ``provenance`` is bound with it, as it is called.
    keywords = {"provenance": None} if takes_provenance(rule) else {}
    try:
        inspect.signature(rule).bind(None, None, None, **keywords)
        found = True
    except (TypeError, ValueError):
        found = False
    # A callable no weak reference can name is read again next time.
    with contextlib.suppress(TypeError):
        _TAKES_CONTEXT[rule] = found
    return found


# Weak keys: a rule made per request (a closure over a request's data) goes with its spec.
_TAKES_CONTEXT: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()
_TAKES_PROVENANCE: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()


def takes_provenance(rule: Callable[..., Any]) -> bool:
    """Whether a rule (a semantic validator) takes a keyword argument ``provenance``: the
    :class:`~fencepost.policy.provenance.Provenance` of the call's arguments. Read from its
    signature once per rule; the two- and three-argument forms are unchanged."""
    try:
        return _TAKES_PROVENANCE[rule]
    except (KeyError, TypeError):
        pass
    try:
        parameter = inspect.signature(rule).parameters.get("provenance")
    except (TypeError, ValueError):
        parameter = None
    found = parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    with contextlib.suppress(TypeError):
        _TAKES_PROVENANCE[rule] = found
    return found


@dataclass(frozen=True, slots=True)
class ToolGate:
    """What the gates read of one registered tool that never changes (a spec is frozen, its
    arguments model a class): worked out once per spec (:func:`tool_gate`), not per proposal."""

    pydantic_json: bool
    """Whether the arguments model validates JSON as pydantic's own ``model_validate_json``
    does: its validator is then called directly (:func:`check_schema`)."""
    query_fields: tuple[str, ...]
    """The query-like fields the built-in empty-query rule checks (none when the tool allows
    an empty query)."""
    range_pairs: tuple[tuple[str, str], ...]
    """The ``(low, high)`` field pairs the built-in reversed-range rule checks."""
    rule_takes_context: bool
    """Whether the tool's semantic validator takes the run's context (:func:`takes_context`)."""
    rule_takes_provenance: bool
    """Whether it takes the call's provenance (:func:`takes_provenance`)."""
    traced: bool
    """Whether a call's arguments are traced to their sources: the tool's calls are
    (``provenance.traced``), or its semantic validator takes their provenance."""
    runs_rules: bool
    """Whether the tool has rules of its own (a semantic validator, a progress predicate): code
    the graph runs contained."""


# By id of a live spec (the weak reference tells a spec from a later one at the same address;
# the entry goes with its spec): nothing here keeps a spec, or a rule closed over a request's
# data, alive.
_TOOL_GATES: dict[int, tuple[weakref.ref[ToolSpec], ToolGate]] = {}


def tool_gate(spec: ToolSpec) -> ToolGate:
    """The :class:`ToolGate` of ``spec``, worked out on its first proposal."""
    key = id(spec)
    found = _TOOL_GATES.get(key)
    if found is not None and found[0]() is spec:
        return found[1]
    rule = spec.semantic_validator
    query_fields, range_pairs = _semantic_plan(spec.args_model)
    with_provenance = rule is not None and takes_provenance(rule)
    made = ToolGate(
        # getattr: an override need not be a bound method (a staticmethod has no ``__func__``).
        pydantic_json=getattr(spec.args_model.model_validate_json, "__func__", None)
        is _VALIDATE_JSON,
        query_fields=() if spec.allow_empty_query else query_fields,
        range_pairs=range_pairs,
        rule_takes_context=rule is not None and takes_context(rule),
        rule_takes_provenance=with_provenance,
        traced=traced(spec) or with_provenance,
        runs_rules=rule is not None or spec.progress_predicate is not None,
    )

    def forget(ref: weakref.ref[ToolSpec], key: int = key) -> None:
        entry = _TOOL_GATES.get(key)
        if entry is not None and entry[0] is ref:
            del _TOOL_GATES[key]

    _TOOL_GATES[key] = (weakref.ref(spec, forget), made)
    return made


def check_semantics(
    spec: ToolSpec,
    args: BaseModel,
    state: AgentState,
    context: RunContext | None = None,
    *,
    call_id: str | None = None,
    provenance: Provenance | None = None,
    run_rule: RuleRunner = run_directly,
) -> None:
    """Gate 3: rules a schema cannot say. Raises :class:`ToolSemanticError`.

    Built in: a query-like field (``query``, ``q``, ``search``...) must not be empty-like
    (``""``, ``"*"``, ``"null"``...) unless the tool allows it (``allow_empty_query``), and a
    date/time range (``start``/``end``, ``since``/``until``...) must not be reversed. Then the
    tool's own ``semantic_validator``, if any: given ``context`` (the run's trusted
    :class:`RunContext`) too when it takes a third argument; one that raises anything else is
    the rule ``validator_failed``, and what it raised is logged with its traceback on
    ``fencepost.gate`` (under the state's run and ``call_id``); one that raises a
    :class:`ToolSemanticError` whose rule is no safe code, the rule :data:`UNNAMED_RULE`
    (logged the same way). A rule that takes a keyword ``provenance`` is given ``provenance``:
    where the call's argument values were seen (:mod:`fencepost.policy.provenance`; ``None``
    when the call is gated outside a batch, as when it is gated again after its approval).
    The validator is run by ``run_rule`` (:mod:`fencepost.policy.rule_runner`): one that did not
    answer in time is the rule :data:`~fencepost.policy.rule_runner.RULE_TIMEOUT`, logged the
    same way (never its text).
    """
    _check_semantics(
        spec,
        tool_gate(spec),
        args,
        state,
        context,
        call_id=call_id,
        provenance=provenance,
        run_rule=run_rule,
    )


def _check_semantics(
    spec: ToolSpec,
    gate: ToolGate,
    args: BaseModel,
    state: AgentState,
    context: RunContext | None,
    *,
    call_id: str | None,
    provenance: Provenance | None,
    run_rule: RuleRunner,
) -> None:
    """:func:`check_semantics` with the tool's gate in hand."""
    values: Mapping[str, Any] = args.__dict__
    if type(args) is spec.args_model:
        query_fields, range_pairs = gate.query_fields, gate.range_pairs
    else:  # an arguments model whose own validation made another model
        query_fields, range_pairs = _semantic_plan(type(args))
        if spec.allow_empty_query:
            query_fields = ()
    for name in query_fields:
        value = values.get(name)
        if isinstance(value, str) and _is_empty_like(value):
            raise ToolSemanticError(f"empty_{name}")
    for low, high in range_pairs:
        a, b = values.get(low), values.get(high)
        comparable = (isinstance(a, datetime) and isinstance(b, datetime)) or (
            isinstance(a, date)
            and isinstance(b, date)
            and not isinstance(a, datetime)
            and not isinstance(b, datetime)
        )
        if comparable and a > b:  # type: ignore[operator]
            raise ToolSemanticError(f"reversed_range_{low}_{high}")
    if spec.semantic_validator is not None:
        rule: Callable[..., None] = spec.semantic_validator
        extra: dict[str, Any] = {"provenance": provenance} if gate.rule_takes_provenance else {}
        try:
            if gate.rule_takes_context:
                run_rule(lambda: rule(args, state, context, **extra))
            else:
                run_rule(lambda: rule(args, state, **extra))
        except RuleTimedOut:
            refused_as = RULE_TIMEOUT
            GATE.warning(
                "the semantic validator of %r did not answer in time (run %s, call %s): "
                "the call is refused",
                spec.name,
                state.run_id,
                call_id,
                extra={"run_id": state.run_id, "call_id": call_id, "code": refused_as},
            )
        except ToolSemanticError as exc:
            named = getattr(exc, "rule", None)
            if type(named) is str and _SAFE_RULE.fullmatch(named):
                raise
            # A rule given as a sentence may quote the model's arguments: the developer reads
            # it in the log; the verdict and everything made of it name no text.
            refused_as = UNNAMED_RULE
            raised(
                GATE,
                f"the semantic validator of {spec.name!r} (a rule that is no safe code)",
                exc,
                run_id=state.run_id,
                call_id=call_id,
                code=refused_as,
            )
        except BaseException as exc:
            if cancelled_by_caller(exc):
                raise
            # A validator that breaks is a denial, not a crash; its message (which may quote the
            # model's arguments) is never kept, only logged for the developer.
            refused_as = "validator_failed"
            raised(
                GATE,
                f"the semantic validator of {spec.name!r}",
                exc,
                run_id=state.run_id,
                call_id=call_id,
                code=refused_as,
            )
        else:
            return
        # Raised outside the handler: the exception it stands for is not kept as its context.
        raise ToolSemanticError(refused_as)


def _declared_progress(
    spec: ToolSpec, proposal: ToolProposal, state: AgentState, run_rule: RuleRunner
) -> bool:
    predicate = spec.progress_predicate
    if predicate is None:
        return False
    try:
        return run_rule(lambda: predicate(proposal, state)) is True
    except RuleTimedOut:
        # A predicate that did not answer in time has not shown progress (fail closed).
        GATE.warning(
            "the progress predicate of %r did not answer in time (run %s, call %s): no progress",
            spec.name,
            state.run_id,
            proposal.call_id,
            extra={"run_id": state.run_id, "call_id": proposal.call_id, "code": RULE_TIMEOUT},
        )
        return False
    except BaseException as exc:
        if cancelled_by_caller(exc):
            raise
        # A predicate that breaks has not shown progress; its traceback is the developer's.
        raised(
            GATE,
            f"the progress predicate of {spec.name!r}",
            exc,
            run_id=state.run_id,
            call_id=proposal.call_id,
            code="no_progress",
        )
        return False


def repeat_limit_of(spec: ToolSpec, repeat_limit: int) -> int:
    """The repeat limit a call of ``spec`` is held to: the tool's own, else the graph's."""
    return spec.repeat_limit if spec.repeat_limit is not None else repeat_limit


def check_progress(
    spec: ToolSpec,
    proposal: ToolProposal,
    state: AgentState,
    *,
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    counts: Mapping[str, int] | None = None,
    fingerprint: str | None = None,
    now: datetime | None = None,
    run_rule: RuleRunner = run_directly,
) -> str:
    """Gate 4: refuse a repeat that brings no new evidence. Returns the key the repeat counts
    under. Raises :class:`NoProgressDetected`.

    The same call with the same last result counts towards the tool's own ``repeat_limit`` when
    it declares one, else ``repeat_limit`` (a new result starts a new count: the status
    changed); a polling tool (``poll_interval_seconds``) is judged by time
    instead — sooner than its interval is no progress, on time always is. O(1): counts and result
    hashes are kept in state (or ``counts`` while a batch is gated), never re-scanned.
    The tool's ``progress_predicate`` is run by ``run_rule``.
    """
    if fingerprint is None:
        fingerprint = proposal_fingerprint(proposal.tool_name, proposal.arguments)
    if spec.poll_interval_seconds is not None:
        last = last_run_at(fingerprint, state)
        if last is not None and now is not None:
            if (now - last).total_seconds() < spec.poll_interval_seconds:
                raise NoProgressDetected(fingerprint)
            return repeat_key(fingerprint, state) + ":poll:" + now.isoformat()
    key = repeat_key(fingerprint, state)
    seen = (state.fingerprints if counts is None else counts).get(key, 0)
    if seen >= repeat_limit_of(spec, repeat_limit) and not _declared_progress(
        spec, proposal, state, run_rule
    ):
        raise NoProgressDetected(fingerprint)
    return key


def authorize(
    spec: ToolSpec,
    principal: Principal,
    *,
    approved: bool = False,
    needs_approval: bool | None = None,
) -> None:
    """Gate 5: the principal holds the capability, and a call that needs approval is approved.

    ``needs_approval``: what the call's ``needs_approval`` callable answered
    (:mod:`fencepost.policy.conditional_approval`); ``None``: a write/external effect needs it.
    Raises :class:`ToolPolicyDenied` or :class:`HumanApprovalRequired`.
    """
    # The catalog a model is shown asks the same (``registry.permitted_names``): one spelling.
    if not principal.has(spec.capability):
        raise ToolPolicyDenied(spec.name, spec.capability)
    needed = spec.effect is not Effect.READ if needs_approval is None else needs_approval
    if needed and not approved:
        raise HumanApprovalRequired(spec.name)


def _field_names(model: type[BaseModel]) -> frozenset[str]:
    names: set[str] = set()
    stack: list[type[BaseModel]] = [model]
    seen: set[type[BaseModel]] = set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, field in current.model_fields.items():
            names.add(name)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                stack.append(annotation)
    return frozenset(names)


def schema_problems(spec: ToolSpec, exc: ValidationError, limit: int = 8) -> tuple[str, ...]:
    """A schema refusal as ``"<field path>: <error type>"`` items. Path parts that are not the
    schema's own field names (a key the model invented) show as ``*``: nothing the model sent is
    echoed back."""
    known = _field_names(spec.args_model)
    out: list[str] = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        parts = [
            str(part) if isinstance(part, int) or part in known else "*" for part in error["loc"]
        ]
        out.append(f"{'.'.join(parts) or '*'}: {error['type']}")
        if len(out) == limit:
            break
    return tuple(dict.fromkeys(out))


def gate_proposal(
    registry: ToolRegistry,
    proposal: ToolProposal,
    state: AgentState,
    principal: Principal,
    *,
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    approved: bool = False,
    counts: Mapping[str, int] | None = None,
    now: datetime | None = None,
    context: RunContext | None = None,
    run_rule: RuleRunner = run_directly,
) -> Verdict:
    """Run gates 1-5 in order and return the verdict as data (budget is reserved separately).

    ``counts`` overrides ``state.fingerprints`` for the repeat check (a batch gated call by call).
    ``context``: the run's trusted context, for the semantic rules that take it.
    ``run_rule``: how the tool's own rules are run (:mod:`fencepost.policy.rule_runner`).
    """
    return gate_with_findings(
        registry,
        proposal,
        state,
        principal,
        repeat_limit=repeat_limit,
        approved=approved,
        counts=counts,
        now=now,
        context=context,
        run_rule=run_rule,
    )[0]


def gate_with_findings(
    registry: ToolRegistry,
    proposal: ToolProposal,
    state: AgentState,
    principal: Principal,
    *,
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    approved: bool = False,
    counts: Mapping[str, int] | None = None,
    now: datetime | None = None,
    context: RunContext | None = None,
    needs_approval: bool | None = None,
    provenance: Provenance | None = None,
    run_rule: RuleRunner = run_directly,
) -> tuple[Verdict, ToolSpec | None, str | None]:
    """:func:`gate_proposal`, with what it found on the way, so a batch does not work either
    out again: the registered spec (``None`` for an unknown tool), and the key the call's
    repeats count under when the repeat check reached it (``repeat_key`` of the fingerprint;
    ``None`` when not reached, or for a polling tool, whose check keys by time).
    ``needs_approval``: this call's answer of its ``needs_approval`` callable, if asked.
    ``provenance``: the call's, for the semantic rules that take it.
    ``run_rule``: how the tool's own rules are run (:mod:`fencepost.policy.rule_runner`)."""
    try:
        spec: ToolSpec | None = check_registered(registry, proposal)
    except UnknownTool:
        spec = None
    return gate_call(
        spec,
        proposal,
        state,
        principal,
        repeat_limit=repeat_limit,
        approved=approved,
        counts=counts,
        now=now,
        context=context,
        needs_approval=needs_approval,
        provenance=provenance,
        run_rule=run_rule,
    )


_VERDICT_DEFAULTS: dict[str, Any] = {
    name: None if info.is_required() else info.get_default()
    for name, info in Verdict.model_fields.items()
}
"""Every field of a verdict in declared order, at its default (the required ones ``None``,
always given): what the gate's verdicts are made from."""


def _verdict(
    proposal: ToolProposal,
    fingerprint: str,
    code: VerdictCode,
    problems: tuple[str, ...] = (),
    missing: str | None = None,
) -> Verdict:
    # Every field is already a checked value: skip re-validating on the hot path.
    values = _VERDICT_DEFAULTS.copy()
    values["call_id"] = proposal.call_id
    values["tool_name"] = proposal.tool_name
    values["fingerprint"] = fingerprint
    values["code"] = code
    if problems:
        values["problems"] = problems
    if missing is not None:
        values["missing_capability"] = missing
    return assemble(Verdict, values)


def gate_call(
    spec: ToolSpec | None,
    proposal: ToolProposal,
    state: AgentState,
    principal: Principal,
    *,
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    approved: bool = False,
    counts: Mapping[str, int] | None = None,
    now: datetime | None = None,
    context: RunContext | None = None,
    needs_approval: bool | None = None,
    provenance: Provenance | None = None,
    run_rule: RuleRunner = run_directly,
    gate: ToolGate | None = None,
) -> tuple[Verdict, ToolSpec | None, str | None]:
    """:func:`gate_with_findings` of a call whose tool was looked up (``spec``: the registered
    one, ``None`` for a name the registry does not hold); ``gate``: ``spec``'s
    :func:`tool_gate`, when the caller has it."""
    # One canonical text of the arguments serves the fingerprint and the schema check.
    canonical_arguments = canonical_json(proposal.arguments)
    fingerprint = fingerprint_of(proposal.tool_name, canonical_arguments)
    if spec is None:
        return _verdict(proposal, fingerprint, VerdictCode.UNKNOWN_TOOL), None, None
    if gate is None:
        gate = tool_gate(spec)
    try:
        args = _validated(spec, gate, proposal, canonical_arguments, state.run_id)
    except ValidationError as exc:
        problems = schema_problems(spec, exc)
        return _verdict(proposal, fingerprint, VerdictCode.SCHEMA_VIOLATION, problems), spec, None
    except ArgumentsValidatorFailed:
        problems = ("*: validator_failed",)
        return _verdict(proposal, fingerprint, VerdictCode.SCHEMA_VIOLATION, problems), spec, None
    try:
        _check_semantics(
            spec,
            gate,
            args,
            state,
            context,
            call_id=proposal.call_id,
            provenance=provenance,
            run_rule=run_rule,
        )
    except ToolSemanticError as exc:
        problems = (f"rule: {exc.rule}",)
        return _verdict(proposal, fingerprint, VerdictCode.SEMANTIC_VIOLATION, problems), spec, None
    try:
        key: str | None = check_progress(
            spec,
            proposal,
            state,
            repeat_limit=repeat_limit,
            counts=counts,
            fingerprint=fingerprint,
            now=now,
            run_rule=run_rule,
        )
    except NoProgressDetected:
        return _verdict(proposal, fingerprint, VerdictCode.NO_PROGRESS), spec, None
    if spec.poll_interval_seconds is not None:
        key = None
    try:
        authorize(spec, principal, approved=approved, needs_approval=needs_approval)
    except ToolPolicyDenied:
        code, missing = VerdictCode.CAPABILITY_DENIED, spec.capability
        return _verdict(proposal, fingerprint, code, missing=missing), spec, key
    except HumanApprovalRequired:
        return _verdict(proposal, fingerprint, VerdictCode.APPROVAL_REQUIRED), spec, key
    return _verdict(proposal, fingerprint, VerdictCode.ALLOWED), spec, key
