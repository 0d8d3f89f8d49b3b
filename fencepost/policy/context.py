"""The trusted run context: who the run acts for and until when. Supplied by the caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, JsonValue, Strict, model_validator

from fencepost.policy.contract import Frozen, no_unknown_keys
from fencepost.policy.deadline import Deadline
from fencepost.policy.tool import Principal


class RunContext(Frozen):
    """LangGraph's ``context_schema`` for a fencepost graph.

    Trusted: it comes from the caller on every ``invoke``/``stream`` (LangGraph does not
    checkpoint it), never from the model or from tool arguments. On resume it must name the same
    tenant and principal the run's ledger account was opened for, or the run ends as
    ``policy_denied``.

    Example::

        ctx = RunContext(
            tenant_id="acme",
            principal=Principal(id="u-1", capabilities={"logs:read", "bank:pay"}),
            deadline=Deadline.after(30),
            app_data={"known_payees": ["GB29NWBK60161331926819"]},
        )
        graph.invoke(start("why is checkout slow?", budget), config, context=ctx)
    """

    tenant_id: str
    principal: Principal
    deadline: Deadline | None = None
    """The run's deadline (an absolute UTC instant); ``None`` means only per-stage timeouts."""
    budget_account: str | None = None
    """A ledger account the run's own account is opened under (its spending is capped by it).

    It must be one the principal may spend from (``ownership.check_funding``): an account that
    records only this tenant (a pool), one that records this principal or grants it
    (``grant:<principal id>`` in its owner), or the principal's own run account (a child run);
    anything else ends the run ``policy_denied`` (``budget_account_denied``) before it spends."""

    app_data: Annotated[dict[str, JsonValue], Strict(False)] = Field(default_factory=dict)
    """The application's own trusted data for this run, as JSON: what its rules and its approver
    judge a call against (the customer's known payees, the domains mail may go to, the ids of
    the records the user owns). Trusted as the rest of the context is: the caller builds it from
    its own records before the run, never from the model, its arguments or a tool's output.
    Semantic rules that take the context (``semantic_validator(args, state, context)``) and the
    approver read it; the model never sees it. Validated as JSON (tuples and sets are not JSON:
    give lists)."""

    injected: dict[str, Any] = Field(default_factory=dict, repr=False, exclude=True)
    """The run's injected dependencies: application objects its tools take (a database handle,
    a client, the environment a tool acts on), by the name a tool parameter's
    ``Annotated[T, Injected("name")]`` gives. Supplied by the caller on every invoke, as the
    rest of the context is; never a schema field, never shown to the model, never checkpointed
    or dumped. Only this object carries them: a context given as a mapping (a server's JSON)
    that names ``injected`` ends the run ``policy_denied`` (``invalid_context``)."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return no_unknown_keys(cls, data)

    def owner(self) -> dict[str, str]:
        """The identity a run's ledger account records: tenant and principal."""
        return {"tenant": self.tenant_id, "principal": self.principal.id}


INJECTED_KEY = "injected"
"""The field a mapping context may never carry: injected dependencies come from the process."""


def coerce_context(value: Any) -> RunContext | None:
    """The context as a :class:`RunContext`, from an instance or a mapping (LangGraph Server).

    Anything that is not a valid context is ``None``: the run then ends ``policy_denied``. A
    mapping naming ``injected`` is not one: a server passes its client's JSON context as a
    mapping, and a client's object (a URL, a handle's name) would replace the application's
    dependency. They come from the process only, in a :class:`RunContext` the application
    builds.
    """
    if value is None or isinstance(value, RunContext):
        return value
    if isinstance(value, Mapping) and INJECTED_KEY in value:
        return None
    try:
        return RunContext.model_validate(value, strict=False)
    except Exception:
        return None
