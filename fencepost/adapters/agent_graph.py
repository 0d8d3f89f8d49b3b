"""``build_agent_graph``: the composition root of the loop.

The graph binding (:mod:`fencepost.graph`) imports no adapter, so the parts it needs from the
edges are put together here: the ledger a graph built with none gets for the checkpointer it is
compiled with (:mod:`fencepost.adapters.default_ledger`), and the telemetry that listens to the
loop's event stream (:mod:`fencepost.adapters.telemetry`, subscribed when this module loads,
which ``import fencepost`` does). :func:`~fencepost.create_agent` calls it.
"""

from __future__ import annotations

from typing import Any, Unpack

from langgraph.graph import StateGraph

from fencepost.adapters import telemetry
from fencepost.adapters.default_ledger import LedgerNeeded, durable_ledger
from fencepost.graph.builder import assemble
from fencepost.graph.events import subscribe
from fencepost.graph.settings import (
    GraphConfigError,
    LoopConfig,
    LoopOptions,
    LoopSettings,
    settings_from,
)
from fencepost.policy import DecisionModel, Ledger, ToolRegistry
from fencepost.policy.context import RunContext

__all__ = ["build_agent_graph"]

subscribe(telemetry.LISTENER)


def build_agent_graph(
    registry: ToolRegistry,
    model: DecisionModel,
    *,
    settings: LoopSettings | None = None,
    **options: Unpack[LoopOptions],
) -> StateGraph[Any, RunContext, Any, Any]:
    """The bounded loop as an uncompiled ``StateGraph`` — compile it with your checkpointer.

    :func:`fencepost.create_agent` builds and compiles it in one call; this is for compiling your
    own (your ``compile`` arguments, or the loop as a node of a graph of yours). ``settings`` is
    an :class:`~fencepost.LoopSettings` (its fields say what each setting does and its default);
    keyword arguments of the same names build one, or change the fields of the one given (the
    keyword wins). :class:`GraphConfigError` names the setting given a bad value.

    Example::

        graph = build_agent_graph(registry, ScriptedDecisionModel([...])).compile(
            checkpointer=InMemorySaver()
        )
        out = graph.invoke(start("question", budget), config, context=RunContext(...))
        run_output(out).termination
    """
    given = settings_from(settings, options)
    cfg = LoopConfig.of(registry, model, given)
    return assemble(cfg, ledger_for=ledger_for if given.ledger is None else None)


def ledger_for(checkpointer: Any) -> Ledger | None:
    """The ledger a graph built with none runs over once compiled with ``checkpointer``: as
    durable as its checkpoints, shared by every graph compiled with it (``None``: no saver to
    keep one beside). ``GraphConfigError`` naming ``ledger`` when none can be made."""
    try:
        return durable_ledger(checkpointer)
    except LedgerNeeded as needed:
        raise GraphConfigError("ledger", str(needed)) from None
