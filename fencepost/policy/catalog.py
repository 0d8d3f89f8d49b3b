"""What the model is shown of the tools: the whole catalog, or only the tools its caller may use.

Per graph (``build_agent_graph(tool_catalog=...)``, ``FencepostMiddleware(tool_catalog=...)``):

- ``"all"`` (the default): every registered tool is shown; a call to one the principal may not
  use is refused by the gate (``capability_denied``).
- ``"permitted"``: each model step is shown only the tools whose capability the run's principal
  holds — the principal the gate judges that step's calls under (after an approval by someone
  else, the requester with the capabilities its account recorded at start). A tool outside its
  rights is not even proposed, and what the catalog says costs tokens only for tools the caller
  can use.

The filter is not the enforcement: the gate still refuses any call the principal may not make,
whatever the model was shown (a model may name a tool it was never given). A model step's plan
shows the catalog (``decide.StepPlan.decision_input``), worked out for each step from the
step's principal: never kept across runs, so one caller's catalog is never another's.

>>> from fencepost.policy.tool import Principal
>>> permitted_names(ToolRegistry([]), Principal(id="u-1"))
frozenset()
"""

from __future__ import annotations

from typing import Literal

from fencepost.policy.gates import holds_capability
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.tool import Principal

ToolCatalog = Literal["all", "permitted"]
"""``"all"``: the model is shown every registered tool; ``"permitted"``: only the tools whose
capability the run's principal holds."""

TOOL_CATALOGS: tuple[ToolCatalog, ...] = ("all", "permitted")


def permitted_names(registry: ToolRegistry, principal: Principal) -> frozenset[str]:
    """The registered tools ``principal`` may call, by the gate's own capability check."""
    return frozenset(spec.name for spec in registry if holds_capability(principal, spec))
