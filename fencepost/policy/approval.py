"""Human approval of write and external effects: what is asked, what answers mean.

A call that needs approval waits (``approval="interrupt"``) until the caller resumes with an
answer. An answer is exactly one of these forms, for every waiting call at once or per call id:

- ``"approve"`` / ``"reject"``
- ``{"decision": "approve" | "reject"}`` (``"type"`` is accepted for ``"decision"``, never both)
- ``{"decision": "edit", "arguments": {...}}``: run with these arguments instead, which pass
  every gate again
- ``{"decision": "approve", "remember": {"scope": "tool" | "arguments", "until": iso8601?}}``:
  approve, and approve always — this tool for the run's tenant, or this tool with these very
  arguments — until revoked or ``until`` (:mod:`fencepost.policy.remembered`)
- ``{"<call id>": <one of the above>, ...}``: per call; a waiting call left out is rejected
- LangChain's HITL response (what Agent Chat UI sends): ``{"decisions": [<decision>, ...]}``, one
  decision per waiting call in the order of the request's ``action_requests`` (a count that
  differs is ``decision_count_mismatch``), each ``{"type": "approve"}``, ``{"type": "reject"}``
  (a ``"message"`` is taken and dropped: the model is told ``permission_denied``, never a
  person's text) or ``{"type": "edit", "edited_action": {"name": <the call's tool>, "args":
  {...}}}`` (an edit never changes the tool). A HITL decision may also stand alone or per call.

``"yes"``, ``True`` and other words are refused, not read as an approval: an approval lets a
write run, so it is said in one of these forms and never inferred from a truthy value a client
sent for something else. The refusal is typed (``unrecognized_answer``) in the next request,
logged on ``fencepost.approval`` (the code and the forms, never the value), and the request's
``response_schema`` (LangGraph's typed interrupt, outside the value) is the JSON schema of every
accepted answer, so a client can show the form before anything is sent.

Anything else is not guessed at: a mapping with a key no form has (a per-call answer beside a
global one, ``"decision"`` beside ``"type"``, ``"arguments"`` on an approval), an answer naming
a call that is not waiting, or an edit whose arguments fail the tool's schema (or that no
checkpoint could hold) is asked again, with a typed error naming the forms (and, for an edit,
the failed fields as paths and error codes, never the values given).

Which calls wait is the gate's verdict: an entry pending approval whose verdict was not made
for its very arguments (and, with a ``verdict_key``, sealed by the gate) is not asked about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import JsonValue, ValidationError

from fencepost.policy.batch import Batch, BatchEntry, replace_entries
from fencepost.policy.context import RunContext
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.decision import ToolProposal
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.events import ToolFailed
from fencepost.policy.fingerprint import MAX_NESTING, fits_checkpoint, proposal_fingerprint
from fencepost.policy.gates import (
    ArgumentsValidatorFailed,
    check_schema,
    gate_proposal,
    schema_problems,
)
from fencepost.policy.may_go_on import context_refusal
from fencepost.policy.outcome import CallOutcome
from fencepost.policy.ownership import recorded_capabilities
from fencepost.policy.progress import repeat_key
from fencepost.policy.receipt import ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.remembered import Remember
from fencepost.policy.rule_runner import RuleRunner, run_directly
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.tool import Principal, ToolSpec
from fencepost.policy.verdict import VerdictCode, verdict_is_sealed

ApprovalMode = Literal["terminate", "interrupt"]
"""``"terminate"`` ends a run that proposes a write as ``approval_required``; ``"interrupt"``
pauses it for a human."""

ACCEPTED_FORMS = (
    '"approve"',
    '"reject"',
    '{"decision": "approve"}',
    '{"decision": "reject"}',
    '{"decision": "edit", "arguments": {...}}',
    '{"decision": "approve", "remember": {"scope": "tool" | "arguments", "until": iso8601?}}',
    '{"<call_id>": <any of the above>, ...} (a call left out is rejected)',
    '{"decisions": [{"type": "approve" | "reject"} | {"type": "edit", "edited_action": '
    '{"name": <tool>, "args": {...}}}, ...]} (LangChain HITL: one per call, in order)',
)

_DECISION_KEYS = ("decision", "type")
"""The key an answer's decision is under (``"type"``, LangChain's HITL name, or ours)."""


class ApprovalAnswer(Frozen):
    """One waiting call's answer."""

    decision: Literal["approve", "reject", "edit"]
    arguments: dict[str, JsonValue] | None = None
    """With ``edit``: the arguments to run with; ``None`` when those given are no JSON object a
    checkpoint can hold (the edit is then asked again)."""
    remember: Remember | None = None
    """With ``approve``: approve always, for this scope (see :class:`Remember`)."""


class InvalidEdit(Frozen):
    """Why one call's edited arguments were refused: field paths and error codes, never the
    values given (``"note: string_type"``)."""

    call_id: str
    problems: tuple[str, ...]


UNREPRESENTABLE_ANSWER = "fencepost:unrepresentable_answer"
"""What the graph hands the approval in place of a resume value no checkpoint could hold
(:func:`storable_answer`): LangGraph stores a resume value before any node reads it, and its
serializer would raise out of ``invoke``. The approval asks again, ``unrepresentable_answer``."""


def storable_answer(response: Any) -> bool:
    """Whether a resume value is one a checkpoint can hold, with room for an answer's own
    levels (a per-call map, an answer mapping) around edited arguments that fit one."""
    return fits_checkpoint(response, max_depth=MAX_NESTING + 2)


class ApprovalProblem(Frozen):
    """An answer fencepost does not take; sent back with the next approval request."""

    code: Literal[
        "unrecognized_answer",
        "invalid_arguments",
        "unrepresentable_answer",
        "decision_count_mismatch",
    ] = "unrecognized_answer"
    accepted_forms: tuple[str, ...] = ACCEPTED_FORMS
    invalid: tuple[InvalidEdit, ...] = ()
    """With ``invalid_arguments``: each edited call whose arguments failed, and why."""
    expected_decisions: int | None = None
    """With ``decision_count_mismatch``: how many HITL decisions the waiting calls take."""


_REJECT = ApprovalAnswer(decision="reject")
_PLAIN = {"approve": ApprovalAnswer(decision="approve"), "reject": _REJECT}
"""The two answers that are a plain word (or a mapping of the decision alone)."""


def _one(value: Any, tools: AbstractSet[str] = frozenset()) -> ApprovalAnswer | None:
    """``value`` as one call's answer, if it is exactly one accepted form. ``tools``: the tool
    names of the calls it answers; a HITL edit must name the one tool they all call."""
    if isinstance(value, str):
        return _PLAIN.get(str(value))
    if not isinstance(value, Mapping):
        return None
    keys = [k for k in value if k in _DECISION_KEYS]
    if len(keys) != 1:
        return None  # no decision, or both spellings of it
    decision = value[keys[0]]
    if not isinstance(decision, str):
        return None
    if len(value) == 1:
        return _PLAIN.get(str(decision))
    if len(value) == 2 and str(decision) == "edit" and "arguments" in value:
        arguments = value["arguments"]
        if not isinstance(arguments, Mapping):
            return None
        return ApprovalAnswer(decision="edit", arguments=_json_object(arguments))
    if len(value) == 2 and str(decision) == "approve" and "remember" in value:
        return _remembered(value["remember"])
    if len(value) == 2 and str(decision) == "reject" and isinstance(value.get("message"), str):
        return _REJECT  # a person's text never reaches the model or the checkpoint
    if len(value) == 2 and str(decision) == "edit" and "edited_action" in value:
        return _hitl_edit(value["edited_action"], tools)
    return None


def _remembered(value: Any) -> ApprovalAnswer | None:
    """An approval that is remembered for the scope ``value`` names (``None``: not a scope)."""
    if not isinstance(value, Mapping) or not all(type(k) is str for k in value):
        return None
    try:
        remember = Remember.model_validate(dict(value), strict=False)
    except ValidationError:
        return None
    return ApprovalAnswer(decision="approve", remember=remember)


def _hitl_edit(action: Any, tools: AbstractSet[str]) -> ApprovalAnswer | None:
    """A LangChain HITL ``edited_action`` (``{"name": ..., "args": {...}}``) as an edit of the
    calls of ``tools``' one tool; one naming another tool (or none) is no edit fencepost takes."""
    if not isinstance(action, Mapping) or set(action) != {"name", "args"}:
        return None
    name, arguments = action["name"], action["args"]
    if len(tools) != 1 or not isinstance(name, str) or str(name) not in tools:
        return None
    if not isinstance(arguments, Mapping):
        return None
    return ApprovalAnswer(decision="edit", arguments=_json_object(arguments))


def _json_object(arguments: Mapping[Any, Any]) -> dict[str, JsonValue] | None:
    # Depth and integer range first (iteratively): a value nested past what a checkpoint holds
    # must be refused before anything tries to validate, store or fingerprint it.
    if not fits_checkpoint(arguments):
        return None
    try:
        return ApprovalAnswer(decision="edit", arguments=dict(arguments)).arguments
    except (ValidationError, RecursionError):
        return None


def parse_approval(
    response: Any, call_ids: Sequence[str], tool_names: Sequence[str] | None = None
) -> dict[str, ApprovalAnswer] | ApprovalProblem:
    """Each waiting call's answer, or the problem with an answer that is not exactly one of the
    accepted forms. A per-call answer never mixes with a global one. ``tool_names``: each
    waiting call's tool, in order (a HITL edit must name its call's tool; without them, none
    is taken)."""
    tools = dict(zip(call_ids, tool_names, strict=True)) if tool_names is not None else {}
    whole = _one(response, frozenset(tools.values()))
    per_call: dict[str, ApprovalAnswer] | None = None
    if (
        isinstance(response, Mapping)
        and response
        and all(isinstance(k, str) and k in call_ids for k in response)
    ):
        # A call the answer leaves out is rejected: it never runs by default.
        read = {
            cid: _one(response[cid], _tool_of(tools, cid)) if cid in response else _REJECT
            for cid in call_ids
        }
        if all(a is not None for a in read.values()):
            per_call = {cid: a for cid, a in read.items() if a is not None}
    hitl = _hitl_decisions(response, call_ids, tools)
    if hitl is not None:
        # A list is no answer of any other form: the HITL reading is the only one.
        return hitl
    if whole is not None:
        answers = {cid: whole for cid in call_ids}
        # Read both ways (a call id may be spelt like a key of a form), they must agree.
        return answers if per_call is None or per_call == answers else ApprovalProblem()
    return per_call if per_call is not None else ApprovalProblem()


def _tool_of(tools: Mapping[str, str], call_id: str) -> AbstractSet[str]:
    return frozenset((tools[call_id],)) if call_id in tools else frozenset()


def _hitl_decisions(
    response: Any, call_ids: Sequence[str], tools: Mapping[str, str]
) -> dict[str, ApprovalAnswer] | ApprovalProblem | None:
    """LangChain's HITL response (``{"decisions": [...]}``), one decision per waiting call in
    request order; ``None`` when ``response`` is not of that shape."""
    if not (
        isinstance(response, Mapping)
        and len(response) == 1
        and "decisions" in response
        and isinstance(response["decisions"], list | tuple)
    ):
        return None
    decisions = response["decisions"]
    if len(decisions) != len(call_ids):
        return ApprovalProblem(code="decision_count_mismatch", expected_decisions=len(call_ids))
    answers: dict[str, ApprovalAnswer] = {}
    for cid, decision in zip(call_ids, decisions, strict=True):
        # Only the HITL spelling (``type``) in a HITL list: a list of fencepost's own forms is
        # a guess at what was meant.
        if not isinstance(decision, Mapping) or "type" not in decision:
            return ApprovalProblem()
        answer = _one(decision, _tool_of(tools, cid))
        if answer is None:
            return ApprovalProblem()
        answers[cid] = answer
    return answers


def edit_problems(
    answers: Mapping[str, ApprovalAnswer], entries: Sequence[BatchEntry], registry: ToolRegistry
) -> ApprovalProblem | None:
    """The problem with the answers' edits, if any edit's arguments are not what its tool takes:
    not a JSON object a checkpoint can hold, or failing the tool's strict schema. Such an edit
    is asked again, never gated into the run's end (semantic rules and the rest of the gates
    judge it once its arguments are well-formed)."""
    invalid: list[InvalidEdit] = []
    for entry in entries:
        answer = answers.get(entry.call_id)
        if answer is None or answer.decision != "edit":
            continue
        if answer.arguments is None:
            invalid.append(InvalidEdit(call_id=entry.call_id, problems=("*: not_representable",)))
            continue
        name = entry.proposal.tool_name
        if name not in registry:
            continue  # an unknown tool is the gate's to refuse
        spec = registry.get(name)
        try:
            proposal = entry.proposal.model_copy(update={"arguments": answer.arguments})
            check_schema(spec, proposal)
        except ValidationError as exc:
            invalid.append(InvalidEdit(call_id=entry.call_id, problems=schema_problems(spec, exc)))
        except ArgumentsValidatorFailed:  # as the gate refuses it: no text kept
            invalid.append(InvalidEdit(call_id=entry.call_id, problems=("*: validator_failed",)))
        except ValueError:  # NaN or an infinity: no JSON
            invalid.append(InvalidEdit(call_id=entry.call_id, problems=("*: not_representable",)))
    if not invalid:
        return None
    return ApprovalProblem(code="invalid_arguments", invalid=tuple(invalid))


def read_answer(
    response: Any, entries: Sequence[BatchEntry], registry: ToolRegistry
) -> dict[str, ApprovalAnswer] | ApprovalProblem:
    """A human's answer to the waiting ``entries``: each call's answer, or the problem that has
    the answer asked again (:func:`parse_approval`, then :func:`edit_problems`)."""
    if isinstance(response, str) and response == UNREPRESENTABLE_ANSWER:
        return ApprovalProblem(code="unrepresentable_answer")
    answers = parse_approval(
        response, [e.call_id for e in entries], [e.proposal.tool_name for e in entries]
    )
    if isinstance(answers, ApprovalProblem):
        return answers
    return edit_problems(answers, entries, registry) or answers


def waiting(
    batch: Batch, *, run_id: str | None = None, verdict_key: bytes | None = None
) -> list[BatchEntry]:
    """The calls of ``batch`` that wait for a human: pending approval by a verdict made for
    these very arguments, and with ``verdict_key`` (and the run's ``run_id``) sealed by the gate.
    Any other pending entry was written by somebody else (so is one whose call id the batch
    holds twice, which the gate never lets through): nobody is asked about it."""
    ids = [e.call_id for e in batch]
    twice = {i for i in ids if ids.count(i) > 1} if len(set(ids)) != len(ids) else set()
    out = []
    for entry in batch:
        verdict = entry.verdict
        if verdict.code is not VerdictCode.APPROVAL_PENDING or entry.call_id in twice:
            continue
        proposal = entry.proposal
        if verdict.tool_name != proposal.tool_name or verdict.fingerprint != _fingerprint(proposal):
            continue
        if verdict_key is not None and not verdict_is_sealed(
            verdict, run_id=run_id or "", key=verdict_key
        ):
            continue
        out.append(entry)
    return out


def _fingerprint(proposal: ToolProposal) -> str | None:
    try:
        return proposal_fingerprint(proposal.tool_name, proposal.arguments)
    except (ValueError, TypeError, RecursionError):
        return None  # arguments no gate could have fingerprinted


def unasked(batch: Batch, asked: Sequence[BatchEntry]) -> Batch:
    """``batch`` without the pending entries that are not ``asked`` (:func:`waiting`): they
    never run and are never asked about, so the run cannot wait on them."""
    # By identity: an entry written beside a waiting one under its call id is not the same one.
    kept = {id(e) for e in asked}
    return tuple(
        e for e in batch if e.verdict.code is not VerdictCode.APPROVAL_PENDING or id(e) in kept
    )


def approval_request(
    entries: Sequence[BatchEntry],
    registry: ToolRegistry,
    problem: ApprovalProblem | None = None,
    *,
    graph_right: str | None = None,
    graph_four_eyes: bool = False,
) -> dict[str, Any]:
    """The interrupt payload a human sees: each waiting call's tool, arguments and effect, and
    who may answer it (``approval_right``: the right a principal other than the requester must
    hold; ``four_eyes``: whether the requester's own answer is refused), and for a traced call
    its ``provenance`` (per argument, the labels of where its values were seen:
    ``{"recipient": ["tool:call_3"]}``); and the same calls as
    LangChain's HITL request (``action_requests`` and ``review_configs``, in the order a
    ``{"decisions": [...]}`` answer follows), which Agent Chat UI renders."""
    calls = []
    actions = []
    reviews = []
    for entry in entries:
        name = entry.proposal.tool_name
        spec = registry.get(name) if name in registry else None
        calls.append(
            {
                "call_id": entry.call_id,
                "tool_name": name,
                "arguments": entry.proposal.arguments,
                "effect": spec.effect.value if spec else None,
                "capability": spec.capability if spec else None,
                "approval_right": approval_right(spec, graph_right=graph_right) if spec else None,
                "four_eyes": needs_four_eyes(spec, graph_four_eyes=graph_four_eyes)
                if spec
                else graph_four_eyes,
            }
        )
        if entry.verdict.provenance is not None:
            # Where each argument's values were seen (labels, never values): the person sees
            # a payee that came only from someone else's mail as such.
            calls[-1]["provenance"] = {k: list(v) for k, v in entry.verdict.provenance.items()}
        effect = spec.effect.value if spec else "unknown"
        actions.append(
            {
                "name": name,
                "args": entry.proposal.arguments,
                "description": f"Approve this {effect} call of {name} (call {entry.call_id})?",
            }
        )
        reviews.append({"action_name": name, "allowed_decisions": list(_HITL_DECISIONS)})
    payload: dict[str, Any] = {
        "fencepost": "approval",
        "calls": calls,
        "action_requests": actions,
        "review_configs": reviews,
    }
    if problem is not None:
        payload["error"] = problem.model_dump(mode="json")
    return payload


_HITL_DECISIONS = ("approve", "edit", "reject")
"""The HITL decision types fencepost takes (``respond``, a person answering for the tool, is
not one: a call either runs, as approved or edited, or does not)."""


def answer_schema(entries: Sequence[BatchEntry], registry: ToolRegistry) -> dict[str, Any]:
    """The JSON schema of every answer the waiting ``entries`` accept: the request's
    ``response_schema`` (LangGraph's typed interrupt), so a client sees the form to send. An
    edit's arguments follow its tool's own schema."""
    defs: dict[str, Any] = {}
    names = [e.proposal.tool_name for e in entries]
    args = {name: _arguments_schema(name, registry, defs) for name in dict.fromkeys(names)}
    plain = [
        {"enum": ["approve", "reject"]},
        {
            "type": "object",
            "properties": {"decision": {"enum": ["approve", "reject"]}},
            "required": ["decision"],
            "additionalProperties": False,
        },
    ]

    remember = {
        "type": "object",
        "properties": {
            "decision": {"const": "approve"},
            "remember": {
                "type": "object",
                "properties": {
                    "scope": {"enum": ["tool", "arguments"]},
                    "until": {"type": "string", "format": "date-time"},
                },
                "required": ["scope"],
                "additionalProperties": False,
            },
        },
        "required": ["decision", "remember"],
        "additionalProperties": False,
    }

    def ours(arguments: dict[str, Any]) -> dict[str, Any]:
        edit = {
            "type": "object",
            "properties": {"decision": {"const": "edit"}, "arguments": arguments},
            "required": ["decision", "arguments"],
            "additionalProperties": False,
        }
        return {"anyOf": [*plain, remember, edit]}

    def hitl(name: str) -> dict[str, Any]:
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"type": {"const": "approve"}},
                    "required": ["type"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"type": {"const": "reject"}, "message": {"type": "string"}},
                    "required": ["type"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "edit"},
                        "edited_action": {
                            "type": "object",
                            "properties": {"name": {"const": name}, "args": args[name]},
                            "required": ["name", "args"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["type", "edited_action"],
                    "additionalProperties": False,
                },
            ]
        }

    one_tool = args[names[0]] if len(args) == 1 else {"type": "object"}
    per_call = {e.call_id: ours(args[e.proposal.tool_name]) for e in entries}
    schema: dict[str, Any] = {
        "title": "fencepost approval answer",
        "description": "One answer for every waiting call, per call id, or LangChain HITL "
        "decisions in the order of action_requests. A call a per-call answer leaves out is "
        "rejected.",
        "anyOf": [
            ours(one_tool),
            {"type": "object", "properties": per_call, "additionalProperties": False},
            {
                "type": "object",
                "properties": {
                    "decisions": {
                        "type": "array",
                        "prefixItems": [hitl(name) for name in names],
                        "items": False,
                        "minItems": len(names),
                        "maxItems": len(names),
                    }
                },
                "required": ["decisions"],
                "additionalProperties": False,
            },
        ],
    }
    if defs:
        schema["$defs"] = defs
    return schema


def _arguments_schema(name: str, registry: ToolRegistry, defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of ``name``'s arguments, its definitions moved into ``defs`` under names
    of the tool's own (two tools' models may share a name)."""
    if name not in registry:
        return {"type": "object"}
    try:
        schema = dict(
            registry.get(name).args_model.model_json_schema(
                ref_template=f"#/$defs/{name}.{{model}}"
            )
        )
    except Exception:  # a type pydantic has no JSON schema for: any object, the gate judges it
        return {"type": "object"}
    for key, value in schema.pop("$defs", {}).items():
        defs[f"{name}.{key}"] = value
    return schema


@dataclass(frozen=True, slots=True)
class ApprovalResult:
    """What the answers did: the batch re-gated, the rejected calls' outcomes, any stop."""

    batch: Batch
    fingerprints: dict[str, int]
    rejected: tuple[CallOutcome, ...]
    stop: StopRequest | None


def apply_approvals(
    state: AgentState,
    answers: Mapping[str, ApprovalAnswer],
    registry: ToolRegistry,
    principal: Principal,
    *,
    repeat_limit: int,
    now: datetime | None = None,
    asked: Sequence[BatchEntry] | None = None,
    context: RunContext | None = None,
    approved_by: str | None = None,
    run_rule: RuleRunner = run_directly,
) -> ApprovalResult:
    """Apply the answers to the waiting calls (``asked``; :func:`waiting` of the state's batch
    when not given): a rejected call is receipted ``denied`` and never runs; an approved or
    edited one passes every gate again (capability included, with the principal that answered).
    A pending entry that was not asked about leaves the batch (:func:`unasked`).
    ``approved_by``: the principal who answered, recorded in each answered call's verdict.
    ``run_rule``: how the tools' own rules are run when a call is gated again
    (:mod:`fencepost.policy.rule_runner`)."""
    answered = {"approval": "human", "approved_by": approved_by}
    counts = dict(state.fingerprints)
    changed: list[BatchEntry] = []
    rejected: list[CallOutcome] = []
    first_stop: StopRequest | None = None
    if asked is None:
        asked = waiting(state.batch)
    for entry in asked:
        answer = answers[entry.call_id]
        name = entry.proposal.tool_name
        if answer.decision == "reject":
            verdict = entry.verdict.model_copy(update={"code": VerdictCode.REJECTED, **answered})
            changed.append(entry.with_verdict(verdict))
            effect = registry.get(name).effect if name in registry else None
            rejected.append(_rejection(entry, effect, approved_by))
            continue
        proposal = entry.proposal
        if answer.decision == "edit":
            try:
                proposal = ToolProposal(
                    call_id=proposal.call_id,
                    tool_name=proposal.tool_name,
                    arguments=answer.arguments or {},
                    depends_on=proposal.depends_on,
                )
            except ValidationError:
                proposal = proposal.model_copy(update={"arguments": {"__invalid__": True}})
        verdict = gate_proposal(
            registry,
            proposal,
            state,
            principal,
            repeat_limit=repeat_limit,
            approved=True,
            counts=counts,
            now=now,
            context=context,
            run_rule=run_rule,
        ).model_copy(update=answered)
        if proposal is entry.proposal:
            # Approved as proposed: its provenance is still the proposal's (an edited call's
            # values are the person's).
            verdict = verdict.model_copy(update={"provenance": entry.verdict.provenance})
        if verdict.allowed:
            key = repeat_key(verdict.fingerprint, state)
            counts[key] = counts.get(key, 0) + 1
        elif first_stop is None and verdict.termination is not None:
            first_stop = stop(verdict.termination, verdict.code.value)
        changed.append(assemble(BatchEntry, {"proposal": proposal, "verdict": verdict}))
    return ApprovalResult(
        batch=replace_entries(unasked(state.batch, asked), changed),
        fingerprints=counts,
        rejected=tuple(rejected),
        stop=first_stop,
    )


def _rejection(entry: BatchEntry, effect: Effect | None, approved_by: str | None) -> CallOutcome:
    return CallOutcome(
        event=ToolFailed(
            call_id=entry.call_id,
            tool_name=entry.proposal.tool_name,
            error_code=ErrorCode.PERMISSION_DENIED,
        ),
        status=ReceiptStatus.DENIED,
        attempts=0,
        effect=effect,
        approval="human",
        approved_by=approved_by,
        rule=VerdictCode.REJECTED.value,
        provenance=entry.verdict.provenance,
    )


# -- who may answer ------------------------------------------------------------------------------

AnswerRefusal = Literal[
    "missing_context",
    "invalid_context",
    "wrong_tenant",
    "approval_right_missing",
    "own_approval_refused",
]
"""Why an answer was not taken from the one who gave it. The run stays paused, nothing of the
answer is written, and the right person can still answer."""

ANSWER_REFUSALS: frozenset[str] = frozenset(get_args(AnswerRefusal))

APPROVE_PREFIX = "approve:"
"""The default approval right of a tool is this prefix and the tool's capability."""


def approval_right(spec: ToolSpec, *, graph_right: str | None = None) -> str:
    """The capability a principal other than the requester must hold to answer ``spec``'s
    approval: the tool's own ``approval_right``, else the graph's, else
    ``approve:<capability>``."""
    return spec.approval_right or graph_right or APPROVE_PREFIX + spec.capability


def needs_four_eyes(spec: ToolSpec, *, graph_four_eyes: bool = False) -> bool:
    """Whether the requester's own answer to ``spec``'s approval is refused: the tool's own
    ``four_eyes`` when it sets one, else the graph's."""
    return graph_four_eyes if spec.four_eyes is None else spec.four_eyes


def may_answer(
    run_owner: Mapping[str, str],
    answerer: RunContext | None,
    rights: Iterable[str],
    *,
    four_eyes: bool = False,
    given: object = None,
) -> AnswerRefusal | None:
    """Whether the principal in ``answerer`` may answer a run's waiting calls (``None``) or why
    not. ``run_owner`` is the identity the run's ledger account records (``{"tenant": ...,
    "principal": ...}``, never state, which any update rewrites); ``rights`` the approval right
    of each waiting call (:func:`approval_right`); ``given`` the context as it was passed.

    The requester may answer its own calls, unless ``four_eyes``; any other principal of the
    run's tenant may answer when it holds every right. A missing or malformed context, another
    tenant's, or a principal without the right is refused, and so is the requester's own
    answer under four-eyes: the answer is not taken and the run keeps waiting.
    """
    if answerer is None:
        return (
            "invalid_context" if context_refusal(given) == "invalid_context" else "missing_context"
        )
    if answerer.tenant_id != run_owner.get("tenant"):
        return "wrong_tenant"
    if answerer.principal.id == run_owner.get("principal"):
        return "own_approval_refused" if four_eyes else None
    if all(answerer.principal.has(right) for right in rights):
        return None
    return "approval_right_missing"


def as_requester(ctx: RunContext, requester: str, capabilities: Iterable[str]) -> RunContext:
    """``ctx`` acting for the run's ``requester``: its principal replaced by the requester
    holding ``capabilities`` only (the approver's own rights never act for the run). The
    deadline, app data and injected dependencies stay the caller's (the application's)."""
    principal = Principal(id=requester, capabilities=frozenset(capabilities))
    return ctx.model_copy(update={"principal": principal})


@dataclass(frozen=True, slots=True)
class Acting:
    """The context a node acts in (:func:`acting_context`), or that the run waits for its
    requester instead."""

    context: RunContext | None
    waits_for_requester: bool = False
    """An approver's answer was taken on an account that records no capabilities (opened
    before they were recorded): the approved calls ran, and the model's next step waits for
    the requester's own context (``decide.waiting_for_requester``)."""


def acting_context(
    owner: Mapping[str, str] | None,
    ctx: RunContext | None,
    *,
    approver: bool,
    fallback: Iterable[str] = (),
) -> Acting:
    """The context a node of the run acts in, given the caller's ``ctx`` and what the run's
    ledger account records: its ``owner`` (``ownership.run_owner``) and, as ``approver``,
    whether it marks ``ctx``'s principal as having answered one of the run's approvals
    (``keys.approver_key``).

    Such an approver, of the owner's tenant and not the requester, carries the run on acting
    for the requester: the requester's identity, holding the capabilities the account recorded
    when the run started (the approver's own never act for the run); deadline, app data and
    injected dependencies stay the caller's (the application's). Where the account records no
    capabilities, it acts with ``fallback`` (the capabilities of the calls the gate judged
    under the requester's) and the model's next step waits for the requester. Anyone else's
    context is returned as it is, and refused by
    :func:`~fencepost.policy.may_go_on.check_before_acting` and by the owner check at every
    reservation, whatever state says.
    """
    if ctx is None or owner is None or not approver or not _another_of_tenant(owner, ctx):
        return Acting(ctx)
    requester = owner["principal"]
    held = recorded_capabilities(owner)
    if held is None:
        return Acting(as_requester(ctx, requester, fallback), waits_for_requester=True)
    return Acting(as_requester(ctx, requester, held))


def _another_of_tenant(owner: Mapping[str, str], ctx: RunContext) -> bool:
    """Whether ``ctx`` names a principal of the owner's tenant other than its requester."""
    principal = owner.get("principal")
    return (
        principal is not None
        and ctx.tenant_id == owner.get("tenant")
        and ctx.principal.id != principal
    )


def allowed_capabilities(batch: Batch, registry: ToolRegistry) -> frozenset[str]:
    """The capabilities of the batch's allowed calls: what the gate found the requester held."""
    names = {e.proposal.tool_name for e in batch if e.verdict.allowed}
    return frozenset(registry.get(n).capability for n in names if n in registry)
