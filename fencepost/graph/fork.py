"""A fork is a new run: the run a thread's earlier checkpoint held, continued on a ledger account
of its own.

LangGraph forks a thread when it is invoked, streamed or updated at a checkpoint that is not the
thread's latest (time travel; Studio's "edit and rerun"). The compiled graph records where in the
``fork`` channel (:class:`~fencepost.graph.state.ForkChannel`). The next node that runs reads it:

- where the checkpoint holds a run that has not ended (going, or paused for approval), that run
  goes on as the fork's run, from the state it had there (its question, its steps, receipts and
  pending batch: what LangGraph replays), under its run id, on an account of its own named from
  the fork (``keys.run_account``'s ``branch``), opened with the run's budget under the caller's
  parent account; its report names the checkpoint (``forked_from``);
- where it holds a run that ended, new input starts the thread's next run from there (the decide
  node, as for any new input), on an account named from the fork too.

The run the fork branches from keeps its checkpoints, its account and its ending. A call id it
ran, or may have, never runs on the fork: the execute node claims each call id for its run on
the thread (``keys.claim_key``; a fork keeps its run's id) before its first attempt, and a claim
another branch holds is reported ``uncertain``, never run again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.runtime import Runtime

from fencepost.graph.account import open_run
from fencepost.graph.node_io import NodeIO
from fencepost.graph.record import FORK_KEY, RunRecord, plain, record_of, step_write
from fencepost.graph.state import LayoutRefused, MendedState, forked_checkpoint, load_state
from fencepost.policy import AgentState, StopRequest
from fencepost.policy.context import coerce_context


async def take_fork(
    io: NodeIO, values: Mapping[str, Any], runtime: Runtime[Any]
) -> tuple[dict[str, Any], AgentState] | None:
    """Where ``values`` were forked at a checkpoint of a run that has not ended and no node has
    taken that fork yet: the channel values with the fork's run in the record, and that run
    (its account opened). None otherwise."""
    fork = values.get("fork")
    if not isinstance(fork, str):
        return None
    try:
        state = load_state(values)
    except LayoutRefused:
        return None
    if state is None or state.is_terminal or state.branch == fork:
        return None
    if isinstance(state, MendedState) and state.invalid:
        return None  # ends invalid_state on the node's own path
    forked = state.model_copy(update={"forked_from": forked_checkpoint(fork), "branch": fork})
    ctx = coerce_context(runtime.context)
    if ctx is not None:
        opened = await open_run(io, forked, ctx)
        if isinstance(opened, StopRequest):
            forked = forked.model_copy(update={"stop": opened})
        else:
            forked = opened
    record = RunRecord(record_of(values))
    record.update(
        forked_from=forked.forked_from,
        branch=fork,
        budget=plain(forked.budget),
        stop=plain(forked.stop),
    )
    record.view = forked
    return {**values, "run": record}, forked


def fork_written(writes: Any, forked: AgentState) -> Any:
    """A node's writes on a fork it took, carrying the fork's fields (where the branch was
    forked, the account's budget view) into the record with whatever the node wrote."""
    if not isinstance(writes, dict):
        return writes
    own = writes.get("run")
    taken = {
        FORK_KEY: True,
        "forked_from": forked.forked_from,
        "branch": forked.branch,
        "budget": plain(forked.budget),
    }
    if forked.stop is not None:
        taken["stop"] = plain(forked.stop)
    after = getattr(writes, "after", forked)
    before = getattr(own, "before", forked)
    writes["run"] = step_write(before, after, {**taken, **(own or {})})
    return writes
