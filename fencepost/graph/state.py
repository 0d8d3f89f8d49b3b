"""The graph's state: three channels, and the typed view a node reads.

- ``request``: what started the run (:class:`StartRequest`, held as plain data);
- ``run``: the run's record, AgentState's fields as plain data (:mod:`fencepost.graph.record`);
- ``messages``: the run as a conversation, for chat UIs (:mod:`fencepost.graph.messages`).

Every value a checkpoint holds is plain data or a LangChain message, so any LangGraph saver with
its default serializer works, strict or not. :func:`load_state` rebuilds the typed
:class:`~fencepost.policy.AgentState` at the node boundary (validated; a value that does not
validate ends the run ``invalid_state``, never half-read), and :func:`run_output` is the
stable typed reader of a run's output or saved state.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langgraph.channels.last_value import LastValue
from langgraph.managed import RemainingSteps
from pydantic import Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

# pydantic builds the JSON schemas from these; on Python < 3.12 only from typing_extensions'.
from typing_extensions import TypedDict

from fencepost.graph.conversation import Messages
from fencepost.graph.record import REPLACED, RunChannel, RunRecord, plain, record_of, run_started
from fencepost.policy import AgentState, RuntimeBudget, TerminationReason
from fencepost.policy.budget import DEFAULT_STEPS, DEFAULT_TOOL_CALLS, default_budget
from fencepost.policy.context import RunContext
from fencepost.policy.contract import Frozen, field_names, without_values
from fencepost.policy.state import as_turn, earlier_run, stop
from fencepost.policy.stop_report import paused_report

LAYOUT = 2
"""The state layout this version writes: one run record channel (1 was a channel per field)."""


def new_run_id() -> str:
    """A fresh run id (what a start request without one gets)."""
    return f"run-{uuid.uuid4().hex[:16]}"


class StartRequest(Frozen):
    """The input that starts a run. Made by :func:`start`, or sent as JSON by a server client
    (``{"question": "..."}`` is enough: ``run_id`` and ``budget`` have defaults)."""

    run_id: str = Field(
        default_factory=new_run_id,
        min_length=1,
        max_length=128,
        description="The run's id in reports and traces (default: a generated one).",
    )
    question: str = Field(description="The question the run answers.")
    budget: RuntimeBudget = Field(
        default_factory=default_budget,
        description=f"What the run may spend (default: {DEFAULT_STEPS} model steps, "
        f"{DEFAULT_TOOL_CALLS} tool calls).",
    )


class RequestChannel(LastValue[Any]):
    """The ``request`` channel: a start request as plain data, whatever form it was given in (a
    :class:`StartRequest` is held as its fields, so no checkpoint holds the record itself)."""

    def update(self, values: Sequence[Any]) -> bool:
        return super().update([_plain_request(v) for v in values])


def _plain_request(value: Any) -> Any:
    if isinstance(value, StartRequest):
        return value.model_dump(mode="json")
    return value


class RetiredChannel(LastValue[Any]):
    """A channel of the first state layout (one per AgentState field), kept by name only so that
    a checkpoint it wrote is recognised and refused (:class:`LayoutRefused`), never half-read.
    Nothing writes it."""

    def update(self, values: Sequence[Any]) -> bool:
        return False


class LayoutRefused(ValueError):
    """The thread's checkpoint was written by another fencepost state layout than this one's
    (:data:`LAYOUT`): it is refused, never half-read.

    >>> str(LayoutRefused(1))
    'checkpoint refused: written by fencepost state layout 1 (a channel per field); this version reads layout 2 (one run record): finish or cancel the run with the version that started it'
    """

    def __init__(self, layout: int) -> None:
        super().__init__(
            f"checkpoint refused: written by fencepost state layout {layout} (a channel per "
            f"field); this version reads layout {LAYOUT} (one run record): finish or cancel "
            "the run with the version that started it"
        )
        self.layout = layout


class RunInProgress(ValueError):
    """New input (a message, a start request) on a thread whose run has not ended: still going,
    or paused for approval. Refused before anything of it is saved: finish the run first
    (answer the approval with ``Command(resume=...)``, resume it with ``invoke(None)``) or
    cancel it (``fp.cancel``); then the input starts the thread's next run.

    >>> str(RunInProgress("t-1", "run-1", paused=True))
    "input refused: run 'run-1' on thread 't-1' is paused for approval: answer it with Command(resume=...) or cancel it, then send the input again"
    """

    def __init__(self, thread_id: str, run_id: str, *, paused: bool) -> None:
        how = (
            "is paused for approval: answer it with Command(resume=...)"
            if paused
            else "has not ended: resume it with invoke(None)"
        )
        super().__init__(
            f"input refused: run {run_id!r} on thread {thread_id!r} {how} or cancel it, "
            "then send the input again"
        )
        self.thread_id = thread_id
        self.run_id = run_id
        self.paused = paused


class TurnChannel(LastValue[Any]):
    """The ``turn`` channel: the id of the ended run that new input on the thread follows. Set
    by the compiled graph when input arrives on a thread whose run ended (whatever a caller
    gives for it is replaced), so the loop starts the thread's next run instead of reading the
    ended one again."""


class ForkChannel(LastValue[Any]):
    """The ``fork`` channel: the checkpoint the thread's latest branch was forked from (time
    travel: an invoke, stream or state update naming a checkpoint other than the thread's
    latest). Set by the compiled graph, never by a caller (a caller's value is refused); the
    next node starts the fork's run from the state as it stood there (see
    :mod:`fencepost.graph.fork`)."""


def fork_token(checkpoint_id: str) -> str:
    """What the ``fork`` channel holds for one fork at ``checkpoint_id``: the checkpoint and a
    fresh suffix, so two forks of one checkpoint are two branches (two runs, two accounts).
    Stored with the fork's first checkpoint, so a resume reads the same one."""
    return f"{checkpoint_id}#{uuid.uuid4().hex[:16]}"


def forked_checkpoint(token: str) -> str:
    """The checkpoint a ``fork`` channel value names (see :func:`fork_token`)."""
    return token.rpartition("#")[0] or token


class GraphState(TypedDict, total=False):
    """LangGraph state schema: the start request, the run's record and the conversation."""

    request: Annotated[StartRequest, RequestChannel(dict)]
    """What started the run (plain data)."""
    run: Annotated[dict[str, Any], RunChannel()]
    """The run's record: AgentState's fields as plain data (read it with :func:`run_output`)."""
    messages: Annotated[list[AnyMessage], Messages]
    """The run as a conversation, for chat UIs and ``stream_mode="messages"``: a view of the
    record, derived by :mod:`fencepost.graph.messages`, never read by the loop."""
    run_id: Annotated[str, RetiredChannel(str)]
    """Layout 1's first field: present only in a checkpoint that layout wrote (refused)."""
    turn: Annotated[str, TurnChannel(str)]
    """The ended run that the thread's latest input follows (set by fencepost, see
    :class:`TurnChannel`)."""
    fork: Annotated[str, ForkChannel(str)]
    """The checkpoint the thread's latest branch was forked from (set by fencepost, see
    :class:`ForkChannel`)."""
    remaining_steps: RemainingSteps


class InputState(TypedDict, total=False):
    """What ``invoke`` takes to start a run, one of:

    - ``{"request": {...}}`` (see :func:`start`; as JSON ``{"request": {"question": "..."}}``,
      ``run_id`` and ``budget`` optional);
    - ``{"messages": [...]}``: the last human message is the question; the run gets a generated
      run id and the default budget (:func:`default_budget`).

    With both, ``request`` starts the run and ``messages`` is kept as given. On a thread whose
    run ended, either starts the thread's next run (see :class:`TurnChannel`; ``turn`` is set
    by fencepost, never by a caller).
    """

    request: Annotated[StartRequest, RequestChannel(dict)]
    messages: Annotated[list[AnyMessage], Messages]
    turn: Annotated[str, TurnChannel(str), SkipJsonSchema()]
    """Set by fencepost (never published: a client's value is replaced)."""
    fork: Annotated[str, ForkChannel(str), SkipJsonSchema()]
    """Set by fencepost on a fork (never published: a client's value is replaced)."""


def start(
    question: str,
    budget: RuntimeBudget | None = None,
    *,
    run_id: str | None = None,
    steps: int = DEFAULT_STEPS,
    tool_calls: int = DEFAULT_TOOL_CALLS,
) -> InputState:
    """The input for ``invoke``/``stream`` that starts a run (plain data, as a server client
    would send it).

    >>> start("why is checkout slow?", RuntimeBudget(steps_remaining=6, tool_calls_remaining=3))["request"]["question"]
    'why is checkout slow?'
    """
    request = StartRequest(
        run_id=run_id or new_run_id(),
        question=question,
        budget=budget or RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tool_calls),
    )
    return {"request": request.model_dump(mode="json")}  # type: ignore[typeddict-item]


def _text_of(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        block if isinstance(block, str) else str(block.get("text") or "")
        for block in content
        if isinstance(block, str) or block.get("type") == "text"
    )


class NoQuestion(ValueError):
    """A run was started with neither a start request nor a human message to answer."""

    def __init__(self) -> None:
        super().__init__('a run starts from {"request": {"question": ...}} or {"messages": [...]}')


class NoRun(ValueError):
    """There is no fencepost run in these values (no run has started on the thread), or none
    with the run id asked for."""

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__(
            "no fencepost run in these values: no run has started on this thread"
            if run_id is None
            else f"no run {run_id!r} on this thread"
        )
        self.run_id = run_id


def request_from(
    values: Mapping[str, Any], *, required: bool = True, run_id: str | None = None
) -> StartRequest | None:
    """The start request in a new run's channel values: ``request`` if given, else one made
    from the last human message in ``messages`` (with the default budget, and ``run_id`` or a
    generated id where none is named). Without either, raises :class:`NoQuestion`
    (``required=False``: returns ``None``)."""
    named: dict[str, Any] = {} if run_id is None else {"run_id": run_id}
    request = values.get("request")
    if request is not None:
        if isinstance(request, StartRequest):
            return request
        request = {**named, **request} if isinstance(request, dict) else request
        return StartRequest.model_validate(request, strict=False)
    for message in reversed(values.get("messages") or ()):
        if isinstance(message, HumanMessage):
            question = _text_of(message).strip()
            if question:
                return StartRequest(question=question, **named)
            break
    if required:
        raise NoQuestion
    return None


def new_run_state(
    request: Any,
    ctx: RunContext | None,
    follows: AgentState | None = None,
    fork: str | None = None,
    thread: str | None = None,
) -> AgentState:
    """A new run's state from its start request, bound to the identity in the caller's context
    (never the model's, never the request's); ``follows``: the ended run it follows on the
    thread, kept in its ``turns`` with the ones before it; ``fork``: the checkpoint the thread's
    branch was forked from (the ``fork`` channel), which this run was forked from where the run
    it follows is of another branch; ``thread``: the checkpoint thread the run starts on (its
    conversation's origin, unless the run it follows names one)."""
    if not isinstance(request, StartRequest):
        request = StartRequest.model_validate(request, strict=False)
    return AgentState(
        run_id=request.run_id,
        question=request.question,
        budget=request.budget,
        tenant_id=ctx.tenant_id if ctx else None,
        principal_id=ctx.principal.id if ctx else None,
        turns=() if follows is None else (*follows.turns, as_turn(follows)),
        branch=fork,
        origin_thread=(follows.origin_thread if follows is not None else None) or thread,
        forked_from=forked_checkpoint(fork)
        if fork is not None and fork != (None if follows is None else follows.branch)
        else None,
    )


def follows_input(state: AgentState, values: Mapping[str, Any]) -> bool:
    """Whether ``state`` is an ended run that new input on its thread follows (the ``turn``
    channel names it): the thread's next run starts."""
    return state.is_terminal and values.get("turn") == state.run_id


def with_pending_fork(values: Mapping[str, Any], state: AgentState) -> AgentState:
    """``state`` as the fork its thread's ``fork`` channel names will make it, where no node
    has taken that fork yet (a fork of a pause, paused again before any node wrote): the run is
    the fork's (its branch, its account), not the one it branched from."""
    fork = values.get("fork")
    if not isinstance(fork, str) or state.is_terminal or state.branch == fork:
        return state
    return state.model_copy(update={"branch": fork, "forked_from": forked_checkpoint(fork)})


def refuse_other_layouts(values: Mapping[str, Any]) -> None:
    """Raise :class:`LayoutRefused` for channel values a checkpoint of layout 1 holds."""
    if "run_id" in values and not run_started(record_of(values)):
        raise LayoutRefused(1)


def refuse_older_checkpoint(channel_versions: Mapping[str, Any]) -> None:
    """Raise :class:`LayoutRefused` for a checkpoint of layout 1, by the channels it has written
    (``channel_versions``): that layout wrote ``run_id`` as a channel, which this one never
    writes. Read before anything of a call is saved, so a refused thread is left as it was."""
    if "run_id" in channel_versions:
        raise LayoutRefused(1)


def has_run(values: Mapping[str, Any]) -> bool:
    """Whether a run has started on the thread these channel values are of."""
    refuse_other_layouts(values)
    return run_started(record_of(values))


_INVALID = stop(TerminationReason.POLICY_DENIED, "invalid_state")
_NO_REQUEST = StartRequest(run_id="run-invalid", question="")


def field_default(name: str) -> Any:
    """The default of AgentState field ``name`` (a fresh one where it has a factory)."""
    return AgentState.model_fields[name].get_default(call_default_factory=True)


class MendedState(AgentState):
    """AgentState from a record whose values did not all validate: each such field holds a stand-in
    (its default; for the run id, question and budget, the start request's). A node's writes
    from it write the mended fields back."""

    rewrite: tuple[str, ...] = ()
    """The fields whose recorded value did not validate, written back with the node's writes."""
    invalid: bool = False
    """A value had no form of its field's type: the run ends, its stop or ``invalid_state``."""


class InvalidState(Exception):
    """Raised by :func:`require_state` for an invalid state: a node that acts does not read
    stops, so ``builder.loop_node`` writes the mended state instead (its stop ends the run)."""

    def __init__(self, state: MendedState) -> None:
        super().__init__(f"no valid value in state field(s) {', '.join(state.rewrite)}")
        self.state = state


def load_state(values: Mapping[str, Any]) -> AgentState | None:
    """AgentState from a node's channel values (None before a run has started on this thread).

    The record a node's own write made carries its typed view; any other (a checkpoint loaded,
    a caller's write applied) is validated once, and a value that does not validate is mended
    (:class:`MendedState`). Raises :class:`LayoutRefused` for a checkpoint of another layout.
    """
    record = record_of(values)
    if not run_started(record):
        refuse_other_layouts(values)
        return None
    view = getattr(record, "view", None)
    if view is not None:
        return view  # type: ignore[no-any-return]
    state = _validated(record, values.get("request"))
    if type(state) is AgentState and type(record) is RunRecord:
        record.view = state
    return state


def _validated(record: Mapping[str, Any], request: Any) -> AgentState:
    data = dict(record)
    invalid: set[str] = set()
    try:
        state = AgentState.model_validate(data)
    except ValidationError as exc:
        # Field names only: no value reaches state or a message.
        invalid = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} or set(data)
        data.update((name, _stand_in(name, request)) for name in invalid)
        try:
            state = AgentState.model_validate(data)
        except ValidationError:
            invalid = set(data) | {"run_id", "question", "budget"}
            state = AgentState.model_validate(
                {name: _stand_in(name, request) for name in ("run_id", "question", "budget")}
            )
    if state.is_terminal and state.termination is None:
        # Terminal, but not made so by the terminal node.
        invalid.add("phase")
        state = state.model_copy(update={"phase": field_default("phase")})
    if not invalid:
        return state
    if state.stop is None or "stop" in invalid:
        invalid.add("stop")
        state = state.model_copy(update={"stop": _INVALID})
    rewrite = tuple(n for n in AgentState.model_fields if n in invalid and n in REPLACED)
    return MendedState.model_construct(**state.__dict__, rewrite=rewrite, invalid=True)


def _stand_in(name: str, request: Any) -> Any:
    if name not in AgentState.model_fields:
        return None
    if not AgentState.model_fields[name].is_required():
        return plain(field_default(name))
    given = _NO_REQUEST
    if isinstance(request, StartRequest):
        given = request
    elif isinstance(request, dict):
        try:
            given = StartRequest.model_validate(request, strict=False)
        except ValidationError:
            given = _NO_REQUEST
    return plain(getattr(given, name))


def require_state(values: Mapping[str, Any]) -> AgentState:
    """AgentState from channel values of a thread a run has started on, for a node that acts:
    raises :class:`InvalidState` where :func:`load_state` mends an invalid value."""
    state = load_state(values)
    if state is None:
        raise RuntimeError("no run on this thread")
    if isinstance(state, MendedState) and state.invalid:
        raise InvalidState(state)
    return state


_STATE_FIELDS = field_names(AgentState)


def _validated_output(record: Mapping[str, Any]) -> AgentState:
    try:
        return AgentState.model_validate(dict(record))
    except ValidationError as exc:
        # A record a caller (or a hand edit) wrote may hold anything: pydantic's error quotes
        # each value it refused, so the error raised names fields only.
        refused = without_values(exc, _STATE_FIELDS)
    raise refused


def run_output(values: Mapping[str, Any], run_id: str | None = None) -> AgentState:
    """A run's output (``invoke``'s return value or ``get_state(...).values``) as AgentState:
    the thread's latest run, or with ``run_id`` that run of the thread. An earlier run is what
    the conversation keeps of it (:class:`~fencepost.policy.turns.Turn`: question, answer,
    ending, stop report, receipts, budget; no observations, proposals or manifests).

    Its ``report`` is the stop report of a run that ended, or, for a run paused for approval,
    the one policy derives from the calls that wait (``waiting_for`` names them); ``None`` while
    a run is still going. Raises :class:`NoRun` where no run has started, and for a record that
    does not validate, pydantic's ``ValidationError`` naming the fields, never their values
    (none in its text or its ``errors()``; a key of a map shows as ``*``).

    >>> import fencepost as fp
    >>> out = {"run": {"run_id": "run-1", "question": "q",
    ...                "budget": {"steps_remaining": 2, "tool_calls_remaining": 1}}}
    >>> fp.run_output(out).budget.steps_remaining
    2
    """
    record = record_of(values)
    if not run_started(record):
        refuse_other_layouts(values)
        raise NoRun
    view = getattr(record, "view", None)
    state = view if view is not None else _validated_output(record)
    if run_id is not None and run_id != state.run_id:
        # The first turn of an id: one a caller appended later cannot stand in for it.
        for turn in state.turns:
            if turn.run_id == run_id:
                return earlier_run(turn)
        raise NoRun(run_id)
    state = with_pending_fork(values, state)
    if state.report is None and not state.is_terminal:
        # Derived on the way out, never written: the checkpoint keeps the terminal node's
        # report as the only stored one.
        paused = paused_report(state)
        if paused is not None:
            state = state.model_copy(update={"report": paused})
    return state


__all__ = [
    "LAYOUT",
    "ForkChannel",
    "GraphState",
    "fork_token",
    "forked_checkpoint",
    "InputState",
    "InvalidState",
    "LayoutRefused",
    "MendedState",
    "NoQuestion",
    "NoRun",
    "RunInProgress",
    "StartRequest",
    "field_default",
    "follows_input",
    "has_run",
    "load_state",
    "new_run_state",
    "new_run_id",
    "refuse_older_checkpoint",
    "refuse_other_layouts",
    "request_from",
    "require_state",
    "run_output",
    "start",
    "with_pending_fork",
]
