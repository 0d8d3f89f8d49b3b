"""Hostile review of 864372d..cc5946f: the ledger key digest without a JSON encoder, the chat
adapter's rendered-turns cache held by weak references, and fp.cancel of a nested run.

Three seats: a caller holding a thread's config (any config to fp.cancel, any context); another
tenant sharing the process (one decider, the key caches) and the ledger; the process itself
(threads, a garbage collection firing weakref callbacks anywhere, even inside the decider's
lock). Each probe that found a bug (a cancel given the parent graph of a nested run did nothing;
a snapshot's pinned config forked from its checkpoint) was fixed with it; the others pin a rule
worth keeping. The Postgres half is tests/adapters/test_hostile_review_ledger_7.py.
"""

from __future__ import annotations

import gc
import hashlib
import json
import threading

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import TerminationReason
from fencepost.policy.decision_model import DecisionInput
from fencepost.policy.observation import Observation
from tests.adapters.fakes import decision_input, tool_observation
from tests.graph.kit import (
    budget,
    call,
    context,
    final_citing_last,
    harness,
    paused_for_approval,
    state_of,
    thread,
    thread_account,
)
from tests.graph.nested_kit import approved, nested_config, nested_paused

# === keys: the digest durable ledgers hold ======================================================


def _json_digest(*parts: str) -> str:
    """The digest as 8f704dd wrote it: every key already in a durable ledger was made so."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode("ascii")).hexdigest()[:32]


# === the decider's rendered turns ================================================================


def _tenant_observation(n: int, secret: str) -> Observation:
    # Same call ids and steps for every tenant: only the content tells whose turn it is.
    return tool_observation(n, {"secret": secret, "n": n})


def _tenant_input(observations: tuple[Observation, ...], secret: str) -> DecisionInput:
    return decision_input(observations, {"q": secret}, run_id="run-same-for-everyone")


def _secrets_shown(messages: list[BaseMessage]) -> set[str]:
    shown: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            for secret in _SECRETS:
                if secret in str(m.content):
                    shown.add(secret)
        if isinstance(m, AIMessage):
            for tc in m.tool_calls:
                shown.add(tc["args"].get("q", ""))
    return shown


_SECRETS = [f"tenant-{i:03d}-secret" for i in range(200)]


class _CollectingLock:
    """The decider's lock, running a garbage collection while held: weakref callbacks fire
    inside ``_remember_prefix`` (and ``_rendered_prefix``) as the collector may fire them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()
        gc.collect()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


# === fp.cancel: nested runs and any config =======================================================


def test_a_stray_namespace_on_a_top_level_runs_config_closes_nothing_and_says_so() -> None:
    # A crafted or stray checkpoint_ns turns a top-level cancel into a nested one: it must
    # close no account it does not name, and report that nothing was cancelled.
    ledger = fp.InMemoryLedger()
    h, config, ctx = paused_for_approval(ledger=ledger)
    stray = {"configurable": {**config["configurable"], "checkpoint_ns": "approve:crafted"}}
    assert fp.cancel(h.graph, stray, context=ctx) is None
    assert ledger.balance(thread_account(config)).closed is None
    out = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert out.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_cancel_with_a_snapshots_config_ends_the_run_cancelled() -> None:
    h, config, ctx = paused_for_approval()
    snapshot_config = h.graph.get_state(config).config
    returned = fp.cancel(h.graph, snapshot_config, context=ctx)
    head = h.graph.get_state(config)
    assert head.next == ()
    assert state_of(h, config).termination is TerminationReason.CANCELLED
    assert returned is not None and returned.termination is TerminationReason.CANCELLED
    assert h.calls.count("write_note") == 0


def test_cancel_with_an_old_snapshots_config_never_rewrites_a_finished_runs_ending() -> None:
    h, config, ctx = paused_for_approval()
    old = h.graph.get_state(config).config
    done = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert done.termination is TerminationReason.COMPLETED
    fp.cancel(h.graph, old, context=ctx)
    assert h.graph.get_state(config).next == ()
    assert state_of(h, config).termination is TerminationReason.COMPLETED


def test_a_top_level_cancel_still_ends_a_running_thread_cancelled() -> None:
    # The nested branch must not swallow the ordinary cancel: no namespace, or an empty one.
    for configurable in ({}, {"checkpoint_ns": ""}):
        ledger = fp.InMemoryLedger()
        h = harness([call("search_logs", 1), final_citing_last], ledger=ledger)
        config = thread()
        ctx = context()
        h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_after=["execute"])
        cfg = {"configurable": {**config["configurable"], **configurable}}
        out = fp.cancel(h.graph, cfg, context=ctx)
        assert out is not None and out.termination is TerminationReason.CANCELLED
        assert ledger.balance(thread_account(config)).closed == "cancelled"


@pytest.mark.parametrize("own_saver", [True, False], ids=["own-saver", "parents-saver"])
def test_cancel_of_a_nested_run_through_its_parent_graph_still_ends_it_cancelled(
    own_saver: bool,
) -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, _, config, ctx, calls = nested_paused(ledger, saver, own_saver=own_saver)
    returned = fp.cancel(parent, nested_config(parent, config), context=ctx)
    # No node of the parent runs in the cancel: the parent's next invoke ends the nested run.
    assert returned is not None and not returned.is_terminal
    assert parent.get_state(config).next == ("agent",)
    assert approved(parent, config, ctx, calls) == ({"out": "cancelled:cancelled"}, 0)
