"""The allowlist: the only tools a run can ever execute, and what the model is shown of them.

What the model is shown, per graph (``build_agent_graph(tool_catalog=...)``,
``FencepostMiddleware(tool_catalog=...)``):

- ``"all"`` (the default): every registered tool is shown; a call to one the principal may not
  use is refused by the gate (``capability_denied``).
- ``"permitted"``: each model step is shown only the tools whose capability the run's principal
  holds — the principal the gate judges that step's calls under (after an approval by someone
  else, the requester with the capabilities its account recorded at start). A tool outside its
  rights is not even proposed, and what the catalog says costs tokens only for tools the caller
  can use.

The filter is not the enforcement: the gate still refuses any call the principal may not make,
whatever the model was shown (a model may name a tool it was never given). The catalog is worked
out for each step from the step's principal (:meth:`ToolRegistry.model_catalog`): never kept
across runs, so one caller's catalog is never another's.

>>> from fencepost.policy.tool import Principal
>>> permitted_names(ToolRegistry([]), Principal(id="u-1"))
frozenset()
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

from fencepost.policy.tool import Principal, ToolSpec

ToolCatalog = Literal["all", "permitted"]
"""``"all"``: the model is shown every registered tool; ``"permitted"``: only the tools whose
capability the run's principal holds."""

TOOL_CATALOGS: tuple[ToolCatalog, ...] = ("all", "permitted")


class UnknownTool(Exception):
    """The model asked for a tool that is not registered."""

    code = "unknown_tool"

    def __init__(self, name: str) -> None:
        # The name is model output: keep its length bounded in the message.
        super().__init__(f"unknown tool {name[:64]!r}")
        self.name = name[:64]


def not_a_tool_spec(entry: object) -> str:
    """What to do with a registry entry that is not a :class:`ToolSpec`, in one sentence: a
    LangChain tool (recognised by its shape: this layer does not import LangChain) needs its
    effect and capability given, a plain function needs the decorator."""
    kind = type(entry).__name__
    name = getattr(entry, "name", None) or getattr(entry, "__name__", None)
    label = name if isinstance(name, str) and name.isidentifier() else "tool"
    if hasattr(entry, "tool_call_schema") and callable(getattr(entry, "invoke", None)):
        return (
            f"registry entry {label!r} is a LangChain tool ({kind}): wrap it as "
            f"tool_spec({label}, effect='read', capability='...') (or fp.tool(...) with the "
            "same keywords) to say what it does and who may call it"
        )
    if callable(entry):
        return (
            f"registry entry {label!r} is a plain {kind}: decorate it with "
            "@fp.tool(effect='read', capability='...') to make it a ToolSpec"
        )
    return f"registry entries must be ToolSpec (from @fp.tool, ToolSpec or tool_spec), got {kind}"


class InvalidCompletionDeclaration(ValueError):
    """A status tool's completion declaration (``completion_evidence``, ``evidence_for``) that
    cannot be honoured: raised when the registry is built, naming the tool and the problem."""


def check_completion_declarations(by_name: dict[str, ToolSpec]) -> None:
    """Every status tool names the accepting tools it is evidence for, each one registered, and
    a tool that names some declares the evidence it must carry. Raises
    :class:`InvalidCompletionDeclaration`."""
    for spec in by_name.values():
        if spec.completion_evidence and not spec.evidence_for:
            raise InvalidCompletionDeclaration(
                f"{spec.name!r} declares completion_evidence but names no accepting tool "
                "in evidence_for: which tool's tasks can its Completed finish?"
            )
        if spec.evidence_for and not spec.completion_evidence:
            raise InvalidCompletionDeclaration(
                f"{spec.name!r} names evidence_for but declares no completion_evidence: "
                "the fields a Completed must carry"
            )
        for name in spec.evidence_for:
            if name not in by_name:
                raise InvalidCompletionDeclaration(
                    f"{spec.name!r} names {name!r}, which is not registered, in evidence_for"
                )


class ToolRegistry:
    """An immutable allowlist of :class:`ToolSpec`, looked up by exact name.

    Names from the model are only ever dictionary keys here: never imported, ``getattr``-ed or
    evaluated. Duplicate names, and completion declarations naming no registered accepting tool,
    are rejected at construction.

    >>> ToolRegistry([]).names()
    ()
    """

    __slots__ = ("_by_name", "_catalog")

    def __init__(self, specs: Iterable[ToolSpec]) -> None:
        by_name: dict[str, ToolSpec] = {}
        for spec in specs:
            if not isinstance(spec, ToolSpec):
                raise TypeError(not_a_tool_spec(spec))
            if spec.name in by_name:
                raise ValueError(f"duplicate tool name {spec.name!r}")
            by_name[spec.name] = spec
        check_completion_declarations(by_name)
        self._by_name = by_name
        self._catalog = tuple(
            {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.args_model.model_json_schema(),
            }
            for spec in by_name.values()
        )

    def get(self, name: str) -> ToolSpec:
        """The spec registered under ``name``; raises :class:`UnknownTool` otherwise."""
        spec = self._by_name.get(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownTool(str(name))
        return spec

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._by_name)

    def model_catalog(
        self, shown: ToolCatalog = "all", principal: Principal | None = None
    ) -> list[dict[str, Any]]:
        """What the model is shown: name, description and JSON schema of each tool, nothing
        else; of every tool (``shown="all"``), or of those ``principal`` may call
        (``"permitted"``: none without a principal)."""
        if shown == "all":
            return [dict(entry) for entry in self._catalog]
        allowed = permitted_names(self, principal) if principal is not None else frozenset()
        return [dict(entry) for entry in self._catalog if entry["name"] in allowed]


def permitted_names(registry: ToolRegistry, principal: Principal) -> frozenset[str]:
    """The registered tools ``principal`` may call, by the gate's own capability check
    (``Principal.has``, as ``gates.authorize`` asks it)."""
    return frozenset(spec.name for spec in registry if principal.has(spec.capability))
