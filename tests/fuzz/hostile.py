"""The hostile world the fuzz suite drives the real graph through: tools, model turns, answers.

Everything here is data hypothesis can draw, print and shrink. Tool bodies log every call they
start (per run id, so a late body of an earlier example never lands in a later one) and then act
out the behaviour their example assigned to their call id. Only tool and model *exceptions* (and
opaque values' ``repr``) carry :data:`CANARY`: tool results are untrusted data that fencepost
legitimately keeps, so a canary there would prove nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, field_validator

import fencepost as fp
from fencepost.policy import ToolSemanticError
from tests.strategies import any_text, unencodable_text

CANARY = "CANARYs3cr3t9f4e2b"
"""A secret only exceptions (and opaque values' ``repr``) carry: it must never be stored or
streamed. Contains no character any serializer escapes, so a raw byte search finds it."""

CAPABILITIES = frozenset({"logs:read", "notes:write", "ops:notify"})
POOL_IDS = ("call-0001", "call-0002", "call-0003", "call-0004")
"""Call ids the model keeps reusing: duplicates within a batch and across steps."""
SLOW_TIMEOUT = 0.03
"""``slow_probe``'s timeout: every ``sleep`` behaviour outlasts it (other tools' do not)."""
SLEEP_SECONDS = 0.06


# -- the log of what actually ran -----------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """One tool body that started."""

    run_id: str
    tool: str
    args: dict[str, Any]
    call_id: str
    attempt: int


@dataclass
class World:
    """What tool bodies read (their example's behaviours) and write (the log)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    log: list[Ran] = field(default_factory=list)
    behaviours: dict[str, tuple[Behaviour, ...]] = field(default_factory=dict)
    returned: set[str] = field(default_factory=set)
    """Runs whose example is over: their invokes returned, nothing of theirs may start now."""
    late: list[Ran] = field(default_factory=list)
    """Bodies that started after their run had returned to its caller."""

    def ran(self, entry: Ran) -> None:
        with self.lock:
            if entry.run_id in self.returned:
                self.late.append(entry)
            self.log.append(entry)

    def forget(self, run_id: str) -> None:
        """The example of ``run_id`` is over: drop its log, and watch for late starts."""
        with self.lock:
            self.returned.add(run_id)
            self.log = [e for e in self.log if e.run_id != run_id]
            self.behaviours.pop(run_id, None)

    def runs_of(self, run_id: str) -> list[Ran]:
        with self.lock:
            return [e for e in self.log if e.run_id == run_id]

    def behaviour(self, run_id: str, call_id: str) -> Behaviour:
        # By a hash of the call id, not by arrival order: a batch runs concurrently.
        plan = self.behaviours.get(run_id) or (Behaviour("ok"),)
        return plan[zlib.crc32(call_id.encode("utf-8", "surrogatepass")) % len(plan)]


WORLD = World()


# -- tool behaviours ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Behaviour:
    """What a tool body does after logging: ``kind`` and one parameter."""

    kind: str
    param: Any = None


class Boom(BaseException):
    """A BaseException no handler expects."""


class RateLimitError(Exception):
    """Named like a provider's error: the name maps to a code, the text must not travel."""


class BadStr(Exception):
    """An exception whose text cannot even be read."""

    def __str__(self) -> str:
        raise RuntimeError(CANARY)

    def __repr__(self) -> str:
        raise RuntimeError(CANARY)


class Opaque:
    """A value with no JSON form, whose repr is a secret."""

    def __repr__(self) -> str:
        return f"Opaque({CANARY})"

    __str__ = __repr__


class Report(BaseModel):
    """A pydantic result: dumped as data."""

    model_config = ConfigDict(extra="forbid")
    status: str
    count: int


CanaryNamed = type(f"Leak{CANARY}", (), {"__repr__": lambda self: CANARY})
"""A class whose very name is the secret (an unserializable result names its type somewhere)."""
CanaryNamedError = type(f"Leak{CANARY}Error", (Exception,), {})


def exception(name: str) -> BaseException:
    """A fresh exception of kind ``name``, carrying the canary wherever it can."""
    makers: dict[str, Callable[[], BaseException]] = {
        "RuntimeError": lambda: RuntimeError(f"password={CANARY}"),
        "ValueError": lambda: ValueError(CANARY),
        "KeyError": lambda: KeyError(CANARY),
        "PermissionError": lambda: PermissionError(CANARY),
        "ConnectionError": lambda: ConnectionError(CANARY),
        "TimeoutError": lambda: TimeoutError(CANARY),
        "RecursionError": lambda: RecursionError(CANARY),
        "RateLimitError": lambda: RateLimitError(CANARY),
        "BadStr": lambda: BadStr(),
        "CanaryNamedError": lambda: CanaryNamedError(CANARY),
        "ExceptionGroup": lambda: ExceptionGroup(CANARY, [RuntimeError(CANARY)]),
        "ToolError": lambda: fp.ToolError(fp.ErrorCode.NOT_FOUND),
        "SystemExit": lambda: SystemExit(CANARY),
        "KeyboardInterrupt": lambda: KeyboardInterrupt(CANARY),
        "GeneratorExit": lambda: GeneratorExit(CANARY),
        "Boom": lambda: Boom(CANARY),
        "CancelledError": lambda: asyncio.CancelledError(CANARY),
        "BaseExceptionGroup": lambda: BaseExceptionGroup(CANARY, [SystemExit(CANARY)]),
    }
    return makers[name]()


TOOL_EXCEPTIONS = (
    "RuntimeError",
    "ValueError",
    "KeyError",
    "PermissionError",
    "ConnectionError",
    "TimeoutError",
    "RecursionError",
    "RateLimitError",
    "BadStr",
    "CanaryNamedError",
    "ExceptionGroup",
    "ToolError",
)
BASE_EXCEPTIONS = (
    "SystemExit",
    "KeyboardInterrupt",
    "GeneratorExit",
    "Boom",
    "CancelledError",
    "BaseExceptionGroup",
)


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": [value]}
    return value


def _unserializable(which: str) -> Any:
    if which == "recursive":
        loop: list[Any] = []
        loop.append(loop)
        return loop
    values: dict[str, Callable[[], Any]] = {
        "opaque": Opaque,
        "opaque_inside": lambda: {"rows": [1, Opaque()]},
        "opaque_key": lambda: {Opaque(): 1},
        "canary_class": CanaryNamed,
        "nan": lambda: {"x": float("nan")},
        "inf": lambda: [float("inf")],
        "set": lambda: {1, 2},
        "bytes": lambda: b"\x00\xff",
        "generator": lambda: (i for i in range(3)),
        "huge_int": lambda: {"n": 2**100},
        "negative_huge_int": lambda: -(2**64),
        "lambda": lambda: lambda: CANARY,
        "coroutine": lambda: asyncio.sleep(0),
    }
    return values[which]()


UNSERIALIZABLE = (
    "opaque",
    "opaque_inside",
    "opaque_key",
    "canary_class",
    "nan",
    "inf",
    "set",
    "bytes",
    "generator",
    "huge_int",
    "negative_huge_int",
    "lambda",
    "coroutine",
    "recursive",
)


def _value(b: Behaviour, call_id: str) -> Any:
    """The value a returning behaviour hands back (after any sleep)."""
    if b.kind == "nested":
        return _nested(b.param, "leaf")
    if b.kind == "huge":
        return {"blob": "x" * b.param, "ints": list(range(min(b.param // 100, 2_000)))}
    if b.kind == "unserializable":
        return _unserializable(b.param)
    if b.kind == "accepted":
        return fp.Accepted(task_id=b.param or f"task-{call_id[:40]}", detail={"queue": "q1"})
    if b.kind == "completed":
        evidence = {"document_id": "doc-1"} if b.param else {}
        return fp.Completed(task_id="task-1", evidence=evidence)
    if b.kind == "model":
        return Report(status="ok", count=3)
    if b.kind == "text":
        # A page holding text no checkpoint stores as it is (a lone surrogate), in a key too.
        return {"page": b.param, b.param: [b.param]}
    return {"ok": True, "call": call_id[:40]}


def act(b: Behaviour, call_id: str) -> Any:
    """A sync body's behaviour."""
    if b.kind == "raise":
        raise exception(b.param)
    if b.kind == "sleep":
        time.sleep(SLEEP_SECONDS)
    if b.kind == "ignore_cancel":
        time.sleep(SLEEP_SECONDS)
    return _value(b, call_id)


async def aact(b: Behaviour, call_id: str) -> Any:
    """An async body's behaviour."""
    if b.kind == "raise":
        raise exception(b.param)
    if b.kind == "sleep":
        await asyncio.sleep(SLEEP_SECONDS)
    if b.kind == "ignore_cancel":
        end = time.monotonic() + SLEEP_SECONDS
        while time.monotonic() < end:
            try:
                await asyncio.sleep(SLEEP_SECONDS / 4)
            except asyncio.CancelledError:
                continue  # swallowed: the runtime must leave this body behind
    return _value(b, call_id)


behaviours = st.one_of(
    st.just(Behaviour("ok")),
    st.builds(Behaviour, st.just("raise"), st.sampled_from(TOOL_EXCEPTIONS)),
    st.builds(Behaviour, st.just("raise"), st.sampled_from(BASE_EXCEPTIONS)),
    st.builds(Behaviour, st.just("unserializable"), st.sampled_from(UNSERIALIZABLE)),
    st.builds(Behaviour, st.just("nested"), st.sampled_from([5, 60, 200, 3_000])),
    st.builds(Behaviour, st.just("huge"), st.sampled_from([10_000, 200_000])),
    st.just(Behaviour("sleep")),
    st.just(Behaviour("ignore_cancel")),
    st.builds(Behaviour, st.just("accepted"), st.none() | st.sampled_from(["task-1", "t"])),
    st.builds(Behaviour, st.just("completed"), st.booleans()),
    st.just(Behaviour("model")),
    st.builds(Behaviour, st.just("text"), unencodable_text()),
)


# -- the registry ---------------------------------------------------------------------------------


def _strict(name: str, **fields: Any) -> type[BaseModel]:
    from pydantic import create_model

    return create_model(  # type: ignore[call-overload, no-any-return]
        name, __config__=ConfigDict(extra="forbid", strict=True), **fields
    )


LookupArgs = _strict("LookupArgs", query=(str, ...))
FetchArgs = _strict("FetchArgs", key=(str, ...), depth=(int, 0))
NoteArgs = _strict("NoteArgs", note=(str, ...))
NotifyArgs = _strict("NotifyArgs", target=(str, ...), urgent=(bool, False))
NoArgs = _strict("NoArgs")
ProbeArgs = _strict("ProbeArgs", n=(int, ...))
StatusArgs = _strict("StatusArgs", task_id=(str, ...))


class GuardedArgs(BaseModel):
    """The guarded tool's arguments, whose own validator breaks out on one value."""

    model_config = ConfigDict(extra="forbid", strict=True)
    value: int

    @field_validator("value")
    @classmethod
    def _breaks_out(cls, value: int) -> int:
        if value == -2:  # control flow no caller asked for: that call's failure, never an escape
            raise asyncio.CancelledError(CANARY)
        return value


def _sync_body(name: str) -> Callable[[BaseModel, fp.ToolContext], Any]:
    def body(args: BaseModel, ctx: fp.ToolContext) -> Any:
        WORLD.ran(
            Ran(ctx.run_id, name, args.model_dump(mode="json"), ctx.idempotency_key, ctx.attempt)
        )
        return act(WORLD.behaviour(ctx.run_id, ctx.idempotency_key), ctx.idempotency_key)

    return body


def _async_body(name: str) -> Callable[[BaseModel, fp.ToolContext], Any]:
    async def body(args: BaseModel, ctx: fp.ToolContext) -> Any:
        WORLD.ran(
            Ran(ctx.run_id, name, args.model_dump(mode="json"), ctx.idempotency_key, ctx.attempt)
        )
        return await aact(WORLD.behaviour(ctx.run_id, ctx.idempotency_key), ctx.idempotency_key)

    return body


def _guard(args: Any, state: fp.AgentState) -> None:
    # A semantic validator that misbehaves on some values: its text must not travel either.
    value = args.value
    if value == -2:
        # A rule given as a sentence: refused as ``unnamed_rule``, its text only logged.
        raise ToolSemanticError(f"value {value} is below zero ({CANARY})")
    if value < 0:
        raise ToolSemanticError("negative")
    raising = {
        3: "RuntimeError",
        4: "SystemExit",
        8: "CancelledError",
        9: "GeneratorExit",
        12: "KeyboardInterrupt",
    }
    if value in raising:
        raise exception(raising[value])


def _progress(proposal: fp.ToolProposal, state: fp.AgentState) -> bool:
    raising = {7: "KeyError", 6: "CancelledError", 10: "GeneratorExit", 11: "KeyboardInterrupt"}
    value = proposal.arguments.get("value")
    if value in raising:
        raise exception(raising[value])
    return False


def _spec(
    name: str,
    args: type[BaseModel],
    effect: fp.Effect,
    capability: str,
    *,
    sync: bool,
    timeout: float = 2.0,
    **extra: Any,
) -> fp.ToolSpec:
    return fp.ToolSpec(
        name=name,
        description=f"The fuzz suite's {name}.",
        args_model=args,
        effect=effect,
        capability=capability,
        timeout_seconds=timeout,
        execute=_sync_body(name) if sync else _async_body(name),
        **extra,
    )


SPECS = (
    _spec("lookup", LookupArgs, fp.Effect.READ, "logs:read", sync=True),
    _spec("fetch", FetchArgs, fp.Effect.READ, "logs:read", sync=False, cost=0.5),
    _spec("write_note", NoteArgs, fp.Effect.WRITE, "notes:write", sync=True, cost=1.0),
    _spec("notify", NotifyArgs, fp.Effect.EXTERNAL, "ops:notify", sync=False),
    _spec("admin_reset", NoArgs, fp.Effect.WRITE, "admin", sync=True),
    _spec("slow_probe", ProbeArgs, fp.Effect.READ, "logs:read", sync=True, timeout=SLOW_TIMEOUT),
    _spec("slow_async", ProbeArgs, fp.Effect.READ, "logs:read", sync=False, timeout=SLOW_TIMEOUT),
    _spec(
        "task_status",
        StatusArgs,
        fp.Effect.READ,
        "logs:read",
        sync=False,
        completion_evidence=("document_id",),
        # Any tool of the world may accept a task (the "accepted" behaviour).
        evidence_for=(
            "lookup",
            "fetch",
            "write_note",
            "notify",
            "admin_reset",
            "slow_probe",
            "slow_async",
            "task_status",
            "guarded",
        ),
    ),
    _spec(
        "guarded",
        GuardedArgs,
        fp.Effect.READ,
        "logs:read",
        sync=True,
        semantic_validator=_guard,
        progress_predicate=_progress,
    ),
)
REGISTRY = fp.ToolRegistry(list(SPECS))
BY_NAME = {s.name: s for s in SPECS}
UNKNOWN_TOOLS = ("rm_rf", "lookup_v2", "eval", "getattr", "os_system", "import_module")
INVALID_NAMES = ("__import__", "os.system", "Lookup", "", "x" * 80, "lookup\x00", "rm -rf /")


# -- model output ---------------------------------------------------------------------------------

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text(max_size=12)
)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(any_text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _hostile_leaf(depths: list[int]) -> st.SearchStrategy[Any]:
    return st.one_of(
        json_leaf,
        st.sampled_from([2**64, 2**200, -(2**63) - 1, -(2**300)]),
        st.sampled_from(depths).map(lambda d: _nested(d, "deep")),
    )


hostile_leaf = _hostile_leaf([5, 60, 120])
"""JSON that validates as JSON but that no checkpoint can store (huge ints, deep nesting); as
deep as a ``ToolProposal`` can be built with."""
raw_hostile_leaf = _hostile_leaf([5, 60, 200, 3_000])
"""The same, nested deeper than pydantic validates: only as raw output the parser must refuse."""


_TEXT = any_text(min_size=1, max_size=12)
_VALID_ARGS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "lookup": st.fixed_dictionaries(
        {"query": st.sampled_from(["checkout 500", "deploy 42", "api", "*", "null"]) | _TEXT}
    ),
    "fetch": st.fixed_dictionaries({"key": _TEXT}, optional={"depth": st.integers(0, 5)}),
    "write_note": st.fixed_dictionaries({"note": _TEXT}),
    "notify": st.fixed_dictionaries({"target": _TEXT}, optional={"urgent": st.booleans()}),
    "admin_reset": st.just({}),
    "slow_probe": st.fixed_dictionaries({"n": st.integers(0, 9)}),
    "slow_async": st.fixed_dictionaries({"n": st.integers(0, 9)}),
    "task_status": st.fixed_dictionaries(
        {"task_id": st.sampled_from(["task-1", "task-2", "t"]) | _TEXT}
    ),
    "guarded": st.fixed_dictionaries({"value": st.integers(-2, 12)}),
}
_OTHER_ARGS = st.fixed_dictionaries({"q": _TEXT})


def _valid_args(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return _VALID_ARGS.get(name, _OTHER_ARGS)


@st.composite
def _arguments_for(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """Mostly arguments that pass the tool's schema (so things run), else garbage."""
    kind = draw(
        st.sampled_from(
            ["valid", "valid", "valid", "valid", "valid", "garbage", "hostile", "extra"]
        )
    )
    if kind == "valid":
        return draw(_valid_args(name))
    if kind == "extra":
        return {**draw(_valid_args(name)), draw(any_text(min_size=1, max_size=6)): draw(json_leaf)}
    if kind == "hostile":
        key = draw(st.sampled_from(["query", "key", "note", "n", "value", "x"]))
        return {key: draw(hostile_leaf)}
    return draw(st.dictionaries(any_text(max_size=8), json_values, max_size=3))


_ARGUMENTS: dict[str, st.SearchStrategy[dict[str, Any]]] = {}


def arguments_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments for ``name`` (one strategy per name, built once)."""
    if name not in _ARGUMENTS:
        _ARGUMENTS[name] = _arguments_for(name)
    return _ARGUMENTS[name]


call_ids = st.one_of(
    st.sampled_from(POOL_IDS),
    st.sampled_from(POOL_IDS),
    st.text(min_size=8, max_size=24),
    st.sampled_from(["\x00" * 8, " " * 8, "\t\n\r\x0b\x0c   ", "call-\x00-1\u2028", "é" * 8]),
)
tool_names = st.sampled_from(tuple(BY_NAME) + tuple(BY_NAME) + tuple(BY_NAME) + UNKNOWN_TOOLS)
RUNNABLE = ("lookup", "fetch", "write_note", "notify", "task_status", "slow_probe", "guarded")


@st.composite
def proposals(draw: st.DrawFn) -> fp.ToolProposal:
    name = draw(tool_names)
    depends = draw(
        st.lists(st.sampled_from(POOL_IDS) | st.text(min_size=1, max_size=10), max_size=2)
        if draw(st.integers(0, 4)) == 0
        else st.just([])
    )
    return fp.ToolProposal(
        call_id=draw(call_ids),
        tool_name=name,
        arguments=draw(arguments_for(name)),
        depends_on=tuple(depends),
    )


@st.composite
def plausible(draw: st.DrawFn) -> fp.ToolProposal:
    """A call that can pass every gate (a registered, callable tool with valid arguments)."""
    name = draw(st.sampled_from(RUNNABLE))
    return fp.ToolProposal(
        call_id=draw(st.sampled_from(POOL_IDS) | st.text(min_size=8, max_size=12)),
        tool_name=name,
        arguments=draw(_valid_args(name)),
    )


@st.composite
def batches(draw: st.DrawFn) -> fp.ToolBatch:
    calls = draw(st.lists(plausible() | proposals(), min_size=1, max_size=4))
    if draw(st.booleans()):
        # Distinct ids, so batches whose calls can all run are drawn often too.
        calls = [
            c.model_copy(update={"call_id": f"b-{i}-{c.call_id}"[:128]})
            for i, c in enumerate(calls)
        ]
    return fp.ToolBatch(calls=tuple(calls))


@dataclass(frozen=True)
class CiteEvidence:
    """A final answer citing the run's real evidence (the last ``n`` ids), or nothing if none."""

    n: int = 1

    def __call__(self, inp: fp.DecisionInput) -> fp.FinalProposal:
        ids = [o.evidence_id for o in inp.observations if o.is_evidence][-self.n :]
        return fp.FinalProposal(answer=fp.AnswerPayload(text="answer", citations=tuple(ids)))


@dataclass(frozen=True)
class ModelRaises:
    """The model raising ``name`` (a fresh exception each time, carrying the canary)."""

    name: str

    def __call__(self, inp: fp.DecisionInput) -> Any:
        raise exception(self.name)


@dataclass(frozen=True)
class Invalid:
    """The model adapter raising :class:`InvalidProposal` with a rule code."""

    code: str

    def __call__(self, inp: fp.DecisionInput) -> Any:
        raise fp.InvalidProposal(self.code)


def _final(text: str, ids: list[str]) -> Any:
    if (ids and not text.strip()) or not _encodable(text):
        # An empty answer cites nothing, and no answer holds a lone surrogate: as the model's
        # raw output, an invalid proposal.
        return {"kind": "final", "answer": {"text": text, "citations": ids}}
    return fp.FinalProposal(answer=fp.AnswerPayload(text=text, citations=tuple(ids)))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


finals = st.builds(
    _final,
    any_text(max_size=12),
    st.lists(st.sampled_from(POOL_IDS) | st.text(max_size=10), max_size=3),
)

raw_outputs = st.one_of(
    json_values,
    any_text(max_size=30),
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["tool", "final", "abstain", "batch", "other"]),
            "call_id": call_ids | st.text(max_size=7),
            "tool_name": tool_names | st.sampled_from(INVALID_NAMES),
            "arguments": st.one_of(
                json_values,
                st.just({"query": float("nan")}),
                st.just({"n": float("inf")}),
                st.dictionaries(any_text(max_size=5), raw_hostile_leaf, max_size=2),
            ),
        }
    ),
    st.just(
        '{"kind": "tool", "call_id": "call-0001", "tool_name": "lookup", "arguments": {"query": NaN}}'
    ),
    st.just('{"kind": "tool", "call_id": "call-0001", "tool_name": "lookup", "argu'),
)

usage_values = st.one_of(
    st.none(),
    st.integers(-10, 400),
    st.sampled_from(
        [-5, 2**64, 2**70, 9_000_000, "3000", "lots", True, [1], float("nan"), float("inf")]
    ),
)

MODEL_EXCEPTIONS = TOOL_EXCEPTIONS + BASE_EXCEPTIONS
"""What a decision model may raise, ``BaseException`` included: every one is the step's failure
(the model runs as a task of its own; see ``tests/fuzz/test_fuzz_regressions.py``)."""
INVALID_CODES = (
    "malformed_decision",
    "truncated_stream",
    "invalid_tool_call",
    f"the model said {CANARY}",  # no safe code: the run ends malformed_decision
)


_ABSTAIN = st.builds(
    fp.AbstainProposal, reason=st.sampled_from(["insufficient_evidence", "needs_clarification"])
)
_USAGE_WRAPPED = (fp.ToolProposal, fp.ToolBatch, fp.FinalProposal)


def _turn_kinds(sync: bool) -> tuple[tuple[int, st.SearchStrategy[Any]], ...]:
    raised = MODEL_EXCEPTIONS
    # (weight, strategy): weights, not one_of's own bias, set how often each kind is drawn;
    # the first kind (a call that can run) is what a failing example shrinks towards.
    return (
        (40, plausible()),
        (12, proposals()),
        (15, batches()),
        (5, finals),
        (7, st.builds(CiteEvidence, st.integers(1, 3))),
        (4, _ABSTAIN),
        (6, raw_outputs),
        (7, st.builds(ModelRaises, st.sampled_from(raised))),
        (4, st.builds(Invalid, st.sampled_from(INVALID_CODES))),
    )


_KINDS = {sync: _turn_kinds(sync) for sync in (True, False)}


@st.composite
def turns(draw: st.DrawFn, *, sync: bool = True) -> Any:
    """One model step: a decision, raw output, an exception, or a decision with hostile usage."""
    kinds = _KINDS[sync]
    pick = draw(st.integers(0, sum(w for w, _ in kinds) - 1))
    for weight, strategy in kinds:
        if pick < weight:
            decision = draw(strategy)
            break
        pick -= weight
    if isinstance(decision, _USAGE_WRAPPED) and draw(st.integers(0, 3)) == 3:
        # model_construct: usage as a buggy adapter could hand it over, past Decided's checks.
        return fp.Decided.model_construct(
            decision=decision,
            input_tokens=draw(usage_values),
            output_tokens=draw(usage_values),
            generated_call_ids=(),
        )
    return decision


# -- approval answers -----------------------------------------------------------------------------


def answers(call_ids: list[str]) -> st.SearchStrategy[Any]:
    """An answer to a paused approval: every accepted form, edits, per-call maps, answers that
    mix forms or carry a key no form has, and garbage."""
    one = st.one_of(
        st.sampled_from(["approve", "reject", "approve", "yes", ""]),
        st.sampled_from([{"decision": "approve"}, {"decision": "reject"}, {"type": "approve"}]),
        st.builds(
            lambda args: {"decision": "edit", "arguments": args},
            st.sampled_from(sorted(BY_NAME)).flatmap(_valid_args) | json_values,
        ),
        st.just({"decision": "edit"}),
        st.just({"decision": "edit", "arguments": "rm -rf"}),
    )
    per_call = (
        st.lists(st.sampled_from(call_ids), unique=True).flatmap(
            lambda ids: st.fixed_dictionaries({i: one for i in ids})
        )
        if call_ids
        else st.just({})
    )
    # Not exactly one form: a global answer beside a per-call one, both spellings of the
    # decision, a key no form has. Each must be asked again, never read as its "decision".
    mixed = st.one_of(
        st.builds(
            lambda word, cid, other: {"decision": word, cid: other},
            st.sampled_from(["approve", "reject"]),
            st.sampled_from(call_ids or ["call-0001"]),
            st.sampled_from(["approve", "reject"]),
        ),
        st.sampled_from(
            [
                {"decision": "approve", "type": "reject"},
                {"decision": "approve", "arguments": {"note": "smuggled"}},
                {"decision": "reject", "why": "no"},
            ]
        ),
    )
    # Past what a checkpoint holds (deep, or an integer msgpack cannot store): asked again.
    deep = st.integers(min_value=60, max_value=400).map(_deep_edit) | st.just(
        {"decision": "edit", "arguments": {"note": 2**70}}
    )
    # Never a bare ``None``: ``Command(resume=None)`` is LangGraph's own UnboundLocalError, before
    # any fencepost code runs (a known limit: ``tests/test_known_limits.py``).
    garbage = json_values.filter(lambda v: v is not None)
    return st.one_of(one, one, per_call, mixed, deep, garbage, st.just({"call-9999": "approve"}))


def _deep_edit(depth: int) -> dict[str, Any]:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return {"decision": "edit", "arguments": {"note": value}}
