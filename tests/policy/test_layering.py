"""The policy layer knows nothing about LangGraph, LangChain, the graph binding or adapters.

Checked on the syntax tree of every module, so imports inside functions or ``TYPE_CHECKING``
blocks count too, and a name in a comment or docstring does not.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import fencepost.policy

POLICY_DIR = Path(fencepost.policy.__file__).parent
FORBIDDEN = ("langgraph", "langchain", "langchain_core", "fencepost.graph", "fencepost.adapters")
# "Imports pydantic and the standard library only" (DESIGN.md), plus the package itself.
ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core", "fencepost"}
DYNAMIC_LOADERS = {"importlib", "runpy", "pkgutil"}
DYNAMIC_CALLS = {"eval", "exec", "__import__", "compile"}


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of every module imported by ``source`` (the module named ``module``)."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # ``from fencepost import graph`` imports fencepost.graph.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(source: str, module: str) -> set[str]:
    return {
        name
        for name in imported_modules(source, module)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }


def policy_modules() -> list[tuple[str, str]]:
    files = sorted(POLICY_DIR.rglob("*.py"))
    assert len(files) > 10, "the policy package was not found where expected"
    out = []
    for path in files:
        relative = path.relative_to(POLICY_DIR.parent.parent).with_suffix("")
        module = ".".join(relative.parts)
        out.append((module, path.read_text(encoding="utf-8")))
    return out


def test_policy_never_imports_langgraph_langchain_graph_or_adapters() -> None:
    offenders = {
        module: sorted(bad)
        for module, source in policy_modules()
        if (bad := forbidden_imports(source, module))
    }
    assert offenders == {}


def test_policy_imports_only_pydantic_and_the_standard_library() -> None:
    offenders = {}
    for module, source in policy_modules():
        roots = {name.split(".")[0] for name in imported_modules(source, module)}
        extra = roots - ALLOWED_THIRD_PARTY - set(sys.stdlib_module_names) - {"__future__"}
        if extra:
            offenders[module] = sorted(extra)
    assert offenders == {}


def test_policy_never_loads_code_by_name() -> None:
    offenders = []
    for module, source in policy_modules():
        if imported_modules(source, module) & DYNAMIC_LOADERS:
            offenders.append(module)
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in DYNAMIC_CALLS
            ):
                offenders.append(f"{module}:{node.lineno}")
    assert offenders == []


def test_the_import_check_catches_every_spelling() -> None:
    # The checker itself must not be blind, or the tests above could never fail.
    module = "fencepost.policy.example"
    cases = {
        "import langgraph": "langgraph",
        "import langgraph.graph as g": "langgraph.graph",
        "from langchain_core.messages import AIMessage": "langchain_core.messages",
        "from langchain.agents import create_agent": "langchain.agents",
        "from fencepost.graph.state import start": "fencepost.graph.state",
        "from fencepost import adapters": "fencepost.adapters",
        "from ..graph import nodes": "fencepost.graph",
        "from .. import adapters": "fencepost.adapters",
        "def f():\n    import langgraph.types\n": "langgraph.types",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import langchain_core\n": (
            "langchain_core"
        ),
    }
    for source, expected in cases.items():
        assert expected in forbidden_imports(source, module), source
    assert forbidden_imports("# import langgraph\n'''from langchain import x'''", module) == set()
    assert forbidden_imports("from fencepost.policy import budget\nimport json", module) == set()
    assert forbidden_imports("import langgraph_like_name", module) == set()
