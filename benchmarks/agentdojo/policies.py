"""A policy = the capabilities granted + the graph's approver + what a denial does.

Every policy is fencepost's own API, nothing simulated around it:

- ``grants(suite, tools)``: the capabilities the run's trusted principal holds (one per tool);
- ``approver(suite)``: the graph's approver policy (``build_agent_graph(approver=...)``), asked
  about every write; it reads the trusted context from the run's ``RunContext.app_data``;
- ``denial``: ``"end_run"`` (a capability or semantic denial ends the run, fencepost's default)
  or ``"observe"`` (it is an observation, the run goes on: ``build_agent_graph(denial=...)``).

Each base policy runs under both denial modes (:data:`POLICIES`). ``approval`` is
``"terminate"``: no human answers during the benchmark, and no approver here asks for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fencepost as fp

from .tools import capability
from .trusted import approve_every_write, rule_approver

Grants = Callable[[str, Sequence[str]], frozenset[str]]
ApproverFor = Callable[[str], Callable[[fp.ApproverInput], fp.ApproverDecision]]

DENIAL_LABELS: Mapping[str, str] = {"end_run": "denial ends the run", "observe": "denial is data"}


@dataclass(frozen=True)
class BasePolicy:
    """Capabilities and approver: one way to run the suites, before the denial mode."""

    name: str
    summary: str
    grants: Grants
    approver: ApproverFor


@dataclass(frozen=True)
class Policy:
    """A base policy under one denial mode: what a graph is built with."""

    base: BasePolicy
    denial: str
    graph_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``<base>/<mode>``: ``approver/observe``."""
        return f"{self.base.name}/{self.denial}"

    @property
    def summary(self) -> str:
        return self.base.summary

    def grants(self, suite: str, tools: Sequence[str]) -> frozenset[str]:
        """The capabilities the run's principal holds."""
        return self.base.grants(suite, tools)

    def build_options(self, suite: str) -> dict[str, Any]:
        """The keywords of ``fp.build_agent_graph`` for a graph of ``suite``."""
        return {
            "approval": "terminate",
            "approver": self.base.approver(suite),
            "denial": self.denial,
            # The results were measured with no repair turn (the default before it was 1).
            "repair_attempts": 0,
            **self.graph_options,
        }


def grant_all(suite: str, tools: Sequence[str]) -> frozenset[str]:
    """Every tool of the suite."""
    return frozenset(capability(suite, t) for t in tools)


LEAST_PRIVILEGE_WITHHELD: dict[str, dict[str, str]] = {
    # Written once per suite from its tool list and its purpose (never from a task's ground
    # truth): which tools an assistant of that purpose is not given, and why.
    "banking": {
        "update_password": "credentials are changed by the customer in the bank's own flow, "
        "never by an assistant",
    },
    "slack": {
        "remove_user_from_slack": "an assistant grows the workspace; removing people is an "
        "administrator's act",
    },
    "travel": {
        "get_user_information": "bookings carry the traveller's details server-side; the "
        "assistant never needs to read passport, card or account numbers",
        "cancel_calendar_event": "a travel assistant adds reminders; it does not clear the "
        "user's calendar",
    },
    "workspace": {
        "delete_email": "the mailbox is the record: an office assistant files and answers "
        "mail, it does not delete it",
    },
}
"""Per suite: the tools least privilege withholds, with the reason from the suite's purpose."""


def grant_least_privilege(suite: str, tools: Sequence[str]) -> frozenset[str]:
    """Every tool of the suite except those its purpose does not need."""
    withheld = LEAST_PRIVILEGE_WITHHELD[suite]
    return frozenset(capability(suite, t) for t in tools if t not in withheld)


def _approve_all(suite: str) -> Callable[[fp.ApproverInput], fp.ApproverDecision]:
    return approve_every_write


PERMISSIVE = BasePolicy(
    name="permissive",
    summary="every capability granted, every write approved",
    grants=grant_all,
    approver=_approve_all,
)
LEAST_PRIVILEGE = BasePolicy(
    name="least-privilege",
    summary="capabilities written once per suite from its purpose; every write approved",
    grants=grant_least_privilege,
    approver=_approve_all,
)
APPROVER = BasePolicy(
    name="approver",
    summary="every capability granted; the graph's approver policy approves a write only if the "
    "suite's rule over the trusted context (`RunContext.app_data`) backs its arguments, and "
    "rejects it otherwise",
    grants=grant_all,
    approver=rule_approver,
)
LEAST_PRIVILEGE_APPROVER = BasePolicy(
    name="least-privilege+approver",
    summary="least privilege's capabilities and the approver policy together",
    grants=grant_least_privilege,
    approver=rule_approver,
)

BASE_POLICIES: tuple[BasePolicy, ...] = (
    PERMISSIVE,
    LEAST_PRIVILEGE,
    APPROVER,
    LEAST_PRIVILEGE_APPROVER,
)
DENIALS: tuple[str, ...] = ("end_run", "observe")

POLICIES: tuple[Policy, ...] = tuple(
    Policy(base, denial) for base in BASE_POLICIES for denial in DENIALS
)
"""Every base policy under each denial mode, in the report's order."""

SHIPPED = "approver/observe"
"""The shipped per-suite policy the targets are checked against: the approver policy over the
trusted context, with denials as data (chosen before the full run, not from its numbers)."""


def named(names: Sequence[str]) -> tuple[Policy, ...]:
    """The policies with these names (``approver/observe``) or base names (``approver``: both
    modes), in the report's order."""
    wanted = set(names)
    return tuple(p for p in POLICIES if p.name in wanted or p.base.name in wanted)
