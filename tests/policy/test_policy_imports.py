"""The policy package has no import cycles between its modules.

Read from each module's syntax tree, so an import inside a function or a ``TYPE_CHECKING`` block
is an edge too: a cycle hidden behind a lazy import is still a cycle a reader has to untangle.
The package ``__init__`` (which re-exports everything) is left out: only module-to-module
edges count.
"""

from __future__ import annotations

from pathlib import Path

import fencepost.policy
from tests.policy.test_layering import imported_modules

PACKAGE = "fencepost.policy"
POLICY_DIR = Path(fencepost.policy.__file__).parent


def module_name(path: Path) -> str:
    relative = path.relative_to(POLICY_DIR).with_suffix("")
    parts = [p for p in relative.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def policy_sources() -> dict[str, tuple[str, bool]]:
    """Every policy module's source, by dotted name, with whether it is a package."""
    files = sorted(POLICY_DIR.rglob("*.py"))
    assert len(files) > 10, "the policy package was not found where expected"
    return {module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in files}


def imported(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Absolute names ``source`` imports (``from a import b`` yields ``a`` and ``a.b``): the
    layering test's reading, with a package's own name as the base of its relative imports."""
    return imported_modules(source, f"{module}.__init__" if is_package else module)


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Edges ``policy module -> policy module``, the package ``__init__`` excluded."""
    modules = set(sources) - {PACKAGE}
    graph: dict[str, set[str]] = {}
    for module in sorted(modules):
        source, is_package = sources[module]
        names = imported(source, module, is_package=is_package)
        # ``fencepost.policy.budget.BudgetAxis`` is an edge to ``fencepost.policy.budget``.
        targets = {m for m in modules for n in names if n == m or n.startswith(m + ".")}
        graph[module] = targets - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` if it is acyclic."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_policy_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph(policy_sources())
    assert len(graph) > 10
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in fencepost.policy: " + " -> ".join(cycle or ())


def test_the_cycle_check_sees_lazy_and_type_checking_imports() -> None:
    # The checker must not be blind, or the test above could never fail.
    sources = {
        PACKAGE: ("from fencepost.policy.a import A\n", True),
        f"{PACKAGE}.a": ("def f():\n    from fencepost.policy import b\n", False),
        f"{PACKAGE}.b": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
            False,
        ),
        f"{PACKAGE}.c": (
            "import fencepost.policy.a.thing\nfrom fencepost.policy import X\n",
            False,
        ),
    }
    graph = import_graph(sources)
    assert graph == {
        f"{PACKAGE}.a": {f"{PACKAGE}.b"},
        f"{PACKAGE}.b": {f"{PACKAGE}.c"},
        f"{PACKAGE}.c": {f"{PACKAGE}.a"},
    }
    assert find_cycle(graph) == [f"{PACKAGE}.{m}" for m in "abca"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None
