"""The four layers hold with no arrow running back up: ``policy`` imports no LangGraph (pinned
module by module in ``tests/policy/test_layering.py``), and ``graph`` imports no adapter — it
emits the loop's events, and the composition root picks the ledger for a saver and subscribes
telemetry. Checked on the syntax tree, so imports inside functions and ``TYPE_CHECKING`` blocks
count too, and a name in a docstring does not."""

from __future__ import annotations

from pathlib import Path

import fencepost.graph
import fencepost.policy
from tests.policy.test_layering import imported_modules

ROOT = Path(fencepost.graph.__file__).parent.parent.parent


def _modules(package: Path) -> list[tuple[str, str]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found.append((module, path.read_text(encoding="utf-8")))
    assert len(found) > 10, f"{package} was not found where expected"
    return found


def _importing(package: Path, below: tuple[str, ...]) -> dict[str, list[str]]:
    offenders = {}
    for module, source in _modules(package):
        bad = sorted(
            name
            for name in imported_modules(source, module)
            if any(name == b or name.startswith(b + ".") for b in below)
        )
        if bad:
            offenders[module] = bad
    return offenders


def test_the_graph_binding_imports_no_adapter() -> None:
    graph = Path(fencepost.graph.__file__).parent
    assert _importing(graph, ("fencepost.adapters", "fencepost.cli", "fencepost.demo")) == {}


def test_policy_imports_no_langgraph_and_no_layer_above_it() -> None:
    policy = Path(fencepost.policy.__file__).parent
    above = ("langgraph", "langchain", "langchain_core", "fencepost.graph", "fencepost.adapters")
    assert _importing(policy, above) == {}


def test_the_root_package_names_the_graph_builder_of_the_composition_root() -> None:
    # fp.build_agent_graph is the composition root's (it picks the ledger for a saver), not a
    # graph module's: the graph layer itself cannot reach the adapters a ledger needs.
    import fencepost as fp
    from fencepost.adapters.agent_graph import build_agent_graph

    assert fp.build_agent_graph is build_agent_graph
