"""A node's I/O: the ledger, the model and the tools, for the sync or the async graph.

A node body is written once, as a coroutine over :class:`NodeIO`. The async graph awaits it with
:class:`AsyncIO` (the ledger's async twins, the model and tools awaited on the caller's loop); the
sync graph drives it with :class:`SyncIO`, whose methods never suspend (the ledger's blocking
methods, the model and tools run to completion through :func:`run_sync`), so one ``send`` runs
the whole body and no policy is written twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from fencepost.graph.containment.model import (
    ModelCall,
    ModelRun,
    run_model,
    run_model_blocking,
    run_model_on_thread,
    run_model_on_thread_blocking,
)
from fencepost.graph.containment.shared_loop import run_sync
from fencepost.graph.containment.tools import ToolRun, run_tool, run_tool_blocking
from fencepost.graph.settings import LoopConfig
from fencepost.policy import (
    Balance,
    BudgetExhausted,
    InMemoryLedger,
    Reservation,
    ToolContext,
    ToolSpec,
)
from fencepost.policy.ledger import Attempt
from fencepost.policy.remembered import ApprovalScope, ScopeStore

T = TypeVar("T")


class NodeIO:
    """The I/O a node body performs. Every method is a coroutine; see the module docstring."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg
        self.ledger = cfg.ledger

    async def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None,
        owner: Mapping[str, str],
    ) -> Balance:
        raise NotImplementedError

    async def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        raise NotImplementedError

    async def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        raise NotImplementedError

    async def release(self, key: str) -> Reservation:
        raise NotImplementedError

    async def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        """Settle a step and hold its calls in one write (``Ledger.settle_and_reserve``)."""
        raise NotImplementedError

    async def reserved(self, account: str, key: str) -> Reservation | None:
        """The reservation under ``key`` as a repeated reserve returns it, without reserving
        (``Ledger.reserved``)."""
        raise NotImplementedError

    async def begin_attempt(self, account: str, marker: str, *, claim: str | None) -> Attempt:
        """Claim a call and write its attempt's start marker in one write
        (``Ledger.begin_attempt``)."""
        raise NotImplementedError

    async def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        """Read an attempt's reservation and, where ``begins`` accepts it, claim the call and
        write the start marker, in one step (``Ledger.start_attempt``)."""
        raise NotImplementedError

    async def finish_attempt(self, account: str, key: str, *, result: str | None) -> Reservation:
        """Mark the attempt's result (when given) and settle it in one write
        (``Ledger.finish_attempt``)."""
        raise NotImplementedError

    async def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        """Usage already spent, held past any limit (``Ledger.charge``)."""
        raise NotImplementedError

    async def close_account(self, account: str, reason: str) -> Balance:
        raise NotImplementedError

    async def balance(self, account: str) -> Balance:
        raise NotImplementedError

    async def get(self, key: str) -> Reservation | None:
        """The reservation (or zero-amount marker) under ``key``, if the ledger holds one."""
        raise NotImplementedError

    async def approval_scopes(self, tenant_id: str, tool_name: str) -> list[ApprovalScope]:
        """The tenant's live remembered approvals of ``tool_name`` (none when the ledger keeps
        none: a ledger of the caller's own that is not a ``ScopeStore``)."""
        raise NotImplementedError

    async def remember_scope(self, scope: ApprovalScope) -> ApprovalScope | None:
        """Store ``scope`` in the ledger's database; ``None`` when the ledger keeps no scopes."""

    async def in_flight(self, account: str) -> dict[str, float]:
        """What reservations in flight hold on ``account`` (``Ledger.in_flight``)."""
        raise NotImplementedError

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` without holding the CPU (a step waiting for room in the budget)."""
        raise NotImplementedError

    async def forget(self, account: str) -> None:
        """Drop an ended run's account from a process-local ledger (an ``InMemoryLedger``
        would otherwise keep every run it ever held); a durable ledger keeps it."""
        if isinstance(self.ledger, InMemoryLedger):
            self.ledger.forget(account)

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run the tools (``make`` builds the awaitable)."""
        raise NotImplementedError

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, which may block its thread for a bounded time (a gate waiting for a
        tool's own rule), where it holds no event loop."""
        raise NotImplementedError

    async def run_model(self, make: ModelCall, timeout: float) -> ModelRun:
        """Run the model call ``make`` builds, contained (see :mod:`fencepost.graph.containment.model`)."""
        raise NotImplementedError

    async def run_model_on_thread(
        self, call: Callable[[], Any], timeout: float, *, tenant: str
    ) -> ModelRun:
        """Run a sync model's call on a thread of ``tenant``'s share, contained (see
        :mod:`fencepost.graph.containment.model`)."""
        raise NotImplementedError

    async def run_tool(
        self, spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
    ) -> ToolRun:
        """Run one tool body, contained (see :mod:`fencepost.graph.containment.tools`)."""
        raise NotImplementedError


class SyncIO(NodeIO):
    """The sync graph's I/O: blocking ledger calls; model and tools run to completion."""

    async def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None,
        owner: Mapping[str, str],
    ) -> Balance:
        return self.ledger.open_account(account, limits, parent=parent, owner=owner)

    async def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        return self.ledger.reserve(account, key, amounts)

    async def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        return self.ledger.settle(key, actual)

    async def release(self, key: str) -> Reservation:
        return self.ledger.release(key)

    async def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        return self.ledger.settle_and_reserve(key, actual, account, holds)

    async def reserved(self, account: str, key: str) -> Reservation | None:
        return self.ledger.reserved(account, key)

    async def begin_attempt(self, account: str, marker: str, *, claim: str | None) -> Attempt:
        return self.ledger.begin_attempt(account, marker, claim=claim)

    async def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        return self.ledger.start_attempt(account, key, marker, claim=claim, begins=begins)

    async def finish_attempt(self, account: str, key: str, *, result: str | None) -> Reservation:
        return self.ledger.finish_attempt(account, key, result=result)

    async def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        return self.ledger.charge(account, key, amounts, of=of)

    async def close_account(self, account: str, reason: str) -> Balance:
        return self.ledger.close_account(account, reason)

    async def balance(self, account: str) -> Balance:
        return self.ledger.balance(account)

    async def get(self, key: str) -> Reservation | None:
        return self.ledger.get(key)

    async def approval_scopes(self, tenant_id: str, tool_name: str) -> list[ApprovalScope]:
        if not isinstance(self.ledger, ScopeStore):
            return []
        return self.ledger.approval_scopes(tenant_id, tool_name=tool_name)

    async def remember_scope(self, scope: ApprovalScope) -> ApprovalScope | None:
        if not isinstance(self.ledger, ScopeStore):
            return None
        return self.ledger.remember_scope(scope)

    async def in_flight(self, account: str) -> dict[str, float]:
        return self.ledger.in_flight(account)

    async def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            return await make()

        return run_sync(wrapped())

    async def off_loop(self, fn: Callable[[], T]) -> T:
        # A sync node holds no loop: its thread may wait.
        return fn()

    async def run_model(self, make: ModelCall, timeout: float) -> ModelRun:
        # Model clients keep process-wide connection pools bound to one loop: every sync model
        # call goes to the one shared loop, never to a per-thread one (tools do).
        return run_model_blocking(make, timeout)

    async def run_model_on_thread(
        self, call: Callable[[], Any], timeout: float, *, tenant: str
    ) -> ModelRun:
        return run_model_on_thread_blocking(call, timeout, tenant=tenant)

    async def run_tool(
        self, spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
    ) -> ToolRun:
        return run_tool_blocking(spec, args, ctx, timeout_seconds=timeout_seconds)


class AsyncIO(NodeIO):
    """The async graph's I/O: the ledger's async twins, never a blocking call on the loop."""

    async def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None,
        owner: Mapping[str, str],
    ) -> Balance:
        return await self.ledger.aopen_account(account, limits, parent=parent, owner=owner)

    async def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        return await self.ledger.areserve(account, key, amounts)

    async def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        return await self.ledger.asettle(key, actual)

    async def release(self, key: str) -> Reservation:
        return await self.ledger.arelease(key)

    async def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        return await self.ledger.asettle_and_reserve(key, actual, account, holds)

    async def reserved(self, account: str, key: str) -> Reservation | None:
        return await self.ledger.areserved(account, key)

    async def begin_attempt(self, account: str, marker: str, *, claim: str | None) -> Attempt:
        return await self.ledger.abegin_attempt(account, marker, claim=claim)

    async def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        return await self.ledger.astart_attempt(account, key, marker, claim=claim, begins=begins)

    async def finish_attempt(self, account: str, key: str, *, result: str | None) -> Reservation:
        return await self.ledger.afinish_attempt(account, key, result=result)

    async def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        return await self.ledger.acharge(account, key, amounts, of=of)

    async def close_account(self, account: str, reason: str) -> Balance:
        return await self.ledger.aclose_account(account, reason)

    async def balance(self, account: str) -> Balance:
        return await self.ledger.abalance(account)

    async def get(self, key: str) -> Reservation | None:
        return await self.ledger.aget(key)

    async def approval_scopes(self, tenant_id: str, tool_name: str) -> list[ApprovalScope]:
        if not isinstance(self.ledger, ScopeStore):
            return []
        return await self.ledger.aapproval_scopes(tenant_id, tool_name=tool_name)

    async def remember_scope(self, scope: ApprovalScope) -> ApprovalScope | None:
        if not isinstance(self.ledger, ScopeStore):
            return None
        return await self.ledger.aremember_scope(scope)

    async def in_flight(self, account: str) -> dict[str, float]:
        return await self.ledger.ain_flight(account)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        return await make()

    async def off_loop(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    async def run_model(self, make: ModelCall, timeout: float) -> ModelRun:
        return await run_model(make, timeout)

    async def run_model_on_thread(
        self, call: Callable[[], Any], timeout: float, *, tenant: str
    ) -> ModelRun:
        return await run_model_on_thread(call, timeout, tenant=tenant)

    async def run_tool(
        self, spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
    ) -> ToolRun:
        return await run_tool(spec, args, ctx, timeout_seconds=timeout_seconds)


def drive(body: Coroutine[Any, Any, T]) -> T:
    """Run a node body that never suspends (over :class:`SyncIO`) to its result."""
    try:
        body.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    body.close()
    raise RuntimeError("a sync node body suspended; its I/O must go through SyncIO")
