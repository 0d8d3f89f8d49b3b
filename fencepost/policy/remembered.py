"""Remembered approvals: "approve always" for a scope, kept per tenant in the ledger's database.

An approver (or a human on resume) may approve a call *and* remember the approval for a scope:

- ``tool``: every later call of this tool, for this tenant;
- ``arguments``: every later call of this tool with the same arguments — matched by the canonical
  fingerprint of the arguments (:func:`~fencepost.policy.fingerprint.proposal_fingerprint`),
  never by a name a caller chooses;

either one optionally ``until`` an instant. A scope is keyed by the tenant of the trusted
context that created it and is only ever consulted for that tenant: another tenant's call never
matches it. A live scope matching a call that needs approval approves it before the approver or
a human is asked; the call's receipt names the scope (``Receipt.scope_id``). Scopes are revocable
(``fencepost approvals revoke``); a revoked or expired scope approves nothing.

Every fencepost ledger stores them (:class:`ScopeStore`): ``InMemoryLedger`` in memory,
``SqliteLedger`` and ``PostgresLedger`` in a table of their own beside the ledger's.
"""

from __future__ import annotations

import asyncio
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field

from fencepost.policy.batch import Batch
from fencepost.policy.contract import Frozen

ScopeKind = Literal["tool", "arguments"]
"""What a remembered approval covers: the tool (any arguments), or the tool with these arguments."""


class Remember(Frozen):
    """What an "approve always" answer asks to remember: its scope and, optionally, until when.

    >>> Remember(scope="tool").scope
    'tool'
    """

    scope: ScopeKind
    until: AwareDatetime | None = None
    """The instant the scope stops approving (timezone-aware); ``None``: until revoked."""


class ApprovalScope(Frozen):
    """One remembered approval, as a ledger stores it."""

    scope_id: Annotated[str, Field(min_length=1, max_length=128)]
    tenant_id: Annotated[str, Field(min_length=1)]
    """The tenant of the trusted context that created it: the only tenant it ever approves for."""
    tool_name: Annotated[str, Field(min_length=1)]
    kind: ScopeKind
    fingerprint: str | None = None
    """With ``arguments``: the fingerprint of tool name and canonical arguments it approves."""
    until: AwareDatetime | None = None
    created_at: AwareDatetime
    created_by: Annotated[str, Field(min_length=1)]
    """The principal whose answer created it (the run's principal for the approver policy)."""
    answered_by: Literal["approver", "human"]
    """Whether the approver policy or a human said "approve always"."""
    run_id: str
    call_id: str
    """The run and call whose approval created it."""
    revoked_at: AwareDatetime | None = None

    def live(self, now: datetime) -> bool:
        """Whether it still approves at ``now``: not revoked, not expired."""
        return self.revoked_at is None and (self.until is None or now < self.until)

    def matches(self, tenant_id: str, tool_name: str, fingerprint: str, now: datetime) -> bool:
        """Whether it approves a call of ``tool_name`` with ``fingerprint`` for ``tenant_id``."""
        if not self.live(now) or self.tenant_id != tenant_id or self.tool_name != tool_name:
            return False
        return self.kind == "tool" or self.fingerprint == fingerprint


def scope_id_for(run_id: str, call_id: str) -> str:
    """The id of the scope a call's "approve always" creates: the same on every replay of the
    node that stores it, so a replay stores it once."""
    digest = hashlib.sha256(f"{run_id}\x00{call_id}".encode()).hexdigest()
    return "scope-" + digest[:24]


def new_scope(
    remember: Remember,
    *,
    tenant_id: str,
    tool_name: str,
    fingerprint: str,
    created_by: str,
    answered_by: Literal["approver", "human"],
    run_id: str,
    call_id: str,
    now: datetime,
) -> ApprovalScope:
    """The scope ``remember`` asks for, for the call ``call_id`` of ``run_id`` approved now."""
    return ApprovalScope(
        scope_id=scope_id_for(run_id, call_id),
        tenant_id=tenant_id,
        tool_name=tool_name,
        kind=remember.scope,
        fingerprint=fingerprint if remember.scope == "arguments" else None,
        until=remember.until,
        created_at=now,
        created_by=created_by,
        answered_by=answered_by,
        run_id=run_id,
        call_id=call_id,
    )


def matching_scope(
    scopes: Iterable[ApprovalScope], tenant_id: str, tool_name: str, fingerprint: str, now: datetime
) -> ApprovalScope | None:
    """The scope that approves the call, if any: the earliest created live match (an arguments
    scope before a tool scope created at the same instant)."""
    found = [s for s in scopes if s.matches(tenant_id, tool_name, fingerprint, now)]
    if not found:
        return None
    return min(found, key=lambda s: (s.created_at, s.kind != "arguments", s.scope_id))


def utc(value: datetime) -> datetime:
    """``value`` in UTC (a naive one is taken as UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class ScopeStore(ABC):
    """Where remembered approvals are kept: every fencepost ledger is one.

    ``remember_scope`` is idempotent by scope id (a replayed node stores its scope once; the
    first one stored wins). Reads and revocations name a tenant and never see another's scopes.
    The async twins run the sync method in a worker thread unless a backend overrides them.
    """

    @abstractmethod
    def remember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        """Store ``scope`` (unless its id is stored already); return the stored one."""

    @abstractmethod
    def approval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        """The tenant's scopes (of ``tool_name`` only, if given), oldest first."""

    @abstractmethod
    def revoke_scope(self, tenant_id: str, scope_id: str, *, at: datetime) -> ApprovalScope | None:
        """Revoke the tenant's scope ``scope_id`` (idempotent: the first revocation's instant
        stays); ``None`` when the tenant has no such scope (another tenant's included)."""

    async def aremember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        """Async :meth:`remember_scope`."""
        return await asyncio.to_thread(self.remember_scope, scope)

    async def aapproval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        """Async :meth:`approval_scopes`."""
        return await asyncio.to_thread(
            self.approval_scopes, tenant_id, tool_name=tool_name, include_revoked=include_revoked
        )

    async def arevoke_scope(
        self, tenant_id: str, scope_id: str, *, at: datetime
    ) -> ApprovalScope | None:
        """Async :meth:`revoke_scope`."""
        return await asyncio.to_thread(self.revoke_scope, tenant_id, scope_id, at=at)


def scopes_to_remember(
    batch: Batch,
    remember: Mapping[str, Remember],
    *,
    tenant_id: str,
    created_by: str,
    answered_by: Literal["approver", "human"],
    run_id: str,
    now: datetime,
) -> list[tuple[str, ApprovalScope]]:
    """By call id, in batch order, the scope of each "approve always" answer (``remember``, by
    call id) whose call the approval let through: the trusted context's tenant's, created by
    its principal. A call the approval did not let through remembers nothing."""
    out: list[tuple[str, ApprovalScope]] = []
    for entry in batch:
        asked = remember.get(entry.call_id)
        if asked is None or not entry.verdict.allowed:
            continue
        scope = new_scope(
            asked,
            tenant_id=tenant_id,
            tool_name=entry.verdict.tool_name,
            fingerprint=entry.verdict.fingerprint,
            created_by=created_by,
            answered_by=answered_by,
            run_id=run_id,
            call_id=entry.call_id,
            now=now,
        )
        out.append((entry.call_id, scope))
    return out


def scopes_named(batch: Batch, named: Mapping[str, str]) -> Batch:
    """``batch`` with each stored scope's id (``named``, by call id) in its call's verdict, so
    its receipt names it too (before the verdict is sealed)."""
    if not named:
        return batch
    return tuple(
        e.with_verdict(e.verdict.model_copy(update={"scope_id": named[e.call_id]}))
        if e.call_id in named
        else e
        for e in batch
    )


__all__ = [
    "ApprovalScope",
    "Remember",
    "ScopeKind",
    "ScopeStore",
    "matching_scope",
    "new_scope",
    "scope_id_for",
    "scopes_named",
    "scopes_to_remember",
]
