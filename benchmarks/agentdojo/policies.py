"""A policy = capability and registry choices + approval handling + graph options.

Every policy shipped here is expressible with fencepost's API today:

- ``grants(suite, tools)``: the capabilities the run's trusted principal holds (one per tool);
- ``effect_of(suite, tool)``: the effect a tool is registered with (a registry choice);
- ``approves(call, trusted)``: how a paused write is answered (the resume loop in
  :mod:`.pipeline` asks it once per waiting call);
- ``graph_options``: keyword arguments of ``fp.build_agent_graph`` (``repeat_limit``,
  ``repair_attempts``...). Approval is always ``"interrupt"`` so that a write can be answered.

A capability denial ends the run ``policy_denied`` (fencepost today has no per-graph choice to
make it an observation); a rejected approval is an observation (``permission_denied``) and the
run goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fencepost as fp

from .tools import capability, default_effect
from .trusted import RULES, PendingCall, TrustedContext

Grants = Callable[[str, Sequence[str]], frozenset[str]]
Approver = Callable[[PendingCall, TrustedContext], bool]


@dataclass(frozen=True)
class Policy:
    """One way to run the suites through fencepost."""

    name: str
    summary: str
    grants: Grants
    approves: Approver
    effect_of: Callable[[str, str], fp.Effect] = lambda suite, tool: default_effect(tool)
    graph_options: Mapping[str, Any] = field(default_factory=dict)


def grant_all(suite: str, tools: Sequence[str]) -> frozenset[str]:
    """Every tool of the suite."""
    return frozenset(capability(suite, t) for t in tools)


def approve_all(call: PendingCall, trusted: TrustedContext) -> bool:
    """Every write is approved."""
    return True


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


def approve_by_rule(call: PendingCall, trusted: TrustedContext) -> bool:
    """The suite's rule over the trusted context (:data:`.trusted.RULES`)."""
    return RULES[trusted.suite](call, trusted)


PERMISSIVE = Policy(
    name="permissive",
    summary="every capability granted, every write approved",
    grants=grant_all,
    approves=approve_all,
)
LEAST_PRIVILEGE = Policy(
    name="least-privilege",
    summary="capabilities written once per suite from its purpose; every write approved",
    grants=grant_least_privilege,
    approves=approve_all,
)
APPROVER = Policy(
    name="approver",
    summary="every capability granted; a simulated human approves a write only if the suite's "
    "rule over the trusted context allows its arguments",
    grants=grant_all,
    approves=approve_by_rule,
)
LEAST_PRIVILEGE_APPROVER = Policy(
    name="least-privilege+approver",
    summary="least privilege's capabilities and the approver's rules together",
    grants=grant_least_privilege,
    approves=approve_by_rule,
)

POLICIES: tuple[Policy, ...] = (PERMISSIVE, LEAST_PRIVILEGE, APPROVER, LEAST_PRIVILEGE_APPROVER)
"""Every policy expressible today, in the report's order."""
