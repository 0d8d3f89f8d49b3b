"""A policy = the capabilities granted + the graph's approver + what a denial does.

Every policy is fencepost's own API, nothing simulated around it:

- ``grants(suite, tools)``: the capabilities the run's trusted principal holds (one per tool);
- ``approver(suite)``: the graph's approver policy (``build_agent_graph(approver=...)``), asked
  about every write; it reads the trusted context from the run's ``RunContext.app_data``;
- ``denial``: ``"end_run"`` (a capability or semantic denial ends the run, fencepost's default)
  or ``"observe"`` (it is an observation, the run goes on: ``build_agent_graph(denial=...)``).

``make agentdojo`` runs each compared base policy with denial as data (:data:`POLICIES`); every
base policy under both modes is in :data:`ALL_POLICIES`. ``approval`` is ``"terminate"``: no
human answers during the benchmark, and no approver here asks for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fencepost as fp

from .provenance import provenance_approver
from .tools import TOOL_GUARDS, capability
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
    guards: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Per suite and tool: the built-in guards set per tool (``@fp.tool`` keywords)."""
    provenance: str | None = None
    """Fencepost's own provenance setting for the graph (``build_agent_graph(provenance=...)``),
    with the trust and sensitivity declared on the tools (:func:`declarations`); ``None``: not
    used (the library's default, ``observe``, records provenance and refuses nothing)."""
    app_data: str = "trusted_context"
    """What the run's ``RunContext.app_data`` holds: ``trusted_context`` (the old approver's
    records, :mod:`.trusted`) or ``provenance`` (the request and the application's own data,
    :func:`provenance_app_data`)."""


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

    @property
    def guards(self) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
        """Per suite and tool: the per-tool guards the policy's tools carry."""
        return self.base.guards

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
            **({"provenance": self.base.provenance} if self.base.provenance else {}),
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
    guards=TOOL_GUARDS,
)
LEAST_PRIVILEGE = BasePolicy(
    name="least-privilege",
    summary="capabilities written once per suite from its purpose; every write approved",
    grants=grant_least_privilege,
    approver=_approve_all,
    guards=TOOL_GUARDS,
)
APPROVER = BasePolicy(
    name="approver",
    summary="every capability granted; the graph's approver policy approves a write only if the "
    "suite's rule over the trusted context (`RunContext.app_data`) backs its arguments, and "
    "rejects it otherwise",
    grants=grant_all,
    approver=rule_approver,
    guards=TOOL_GUARDS,
)
LEAST_PRIVILEGE_APPROVER = BasePolicy(
    name="least-privilege+approver",
    summary="least privilege's capabilities and the approver policy together",
    grants=grant_least_privilege,
    approver=rule_approver,
    guards=TOOL_GUARDS,
)

# --- RECOMMENDED ------------------------------------------------------------------------------
# Written once for all four suites from the tool catalogue and each suite's purpose, before any
# run of it and without reading an injection task (benchmarks/agentdojo.md says how).

TRUSTED_OUTPUTS: Mapping[str, frozenset[str]] = {
    # Systems of record the application controls. Everything else is untrusted (the default):
    # mail, messages, web pages, files, transaction descriptions, vendors' listings and reviews,
    # and every write's own output (it echoes the arguments the model chose).
    "banking": frozenset(
        # The bank's own figures and the customer's profile and standing orders (the customer
        # set them up). Not the transaction history: counterparties write its subjects and
        # choose the accounts money comes from; not files: others write them.
        {"get_iban", "get_balance", "get_scheduled_transactions", "get_user_info"}
    ),
    "slack": frozenset(
        # The workspace's directory: its channels and who is in them. Not messages (members and
        # outsiders write them), not the inbox, not web pages.
        {"get_channels", "get_users_in_channel"}
    ),
    "travel": frozenset(
        # The user's profile and calendar. Not hotels', restaurants', car companies' or
        # airlines' listings and reviews: vendors and the public write them.
        {"get_user_information", "search_calendar_events", "get_day_calendar_events"}
    ),
    "workspace": frozenset(
        # The clock, the calendar and the address book: records the user's own applications
        # keep. Not mail, not files (others write and share them).
        {
            "get_current_day",
            "search_calendar_events",
            "get_day_calendar_events",
            "search_contacts_by_name",
            "search_contacts_by_email",
        }
    ),
}
"""Per suite: the tools whose output is trusted (``output_trust=TRUSTED``); the rest are not."""

SENSITIVE: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    # Per tool, the arguments that say where money, data or access goes (recipient, URL,
    # audience, the object destroyed) or what a credential becomes. ``url?query``: only the
    # values of the URL's query, what a fetch sends (the host is where the reading goes).
    "banking": {
        "send_money": ("recipient",),
        "schedule_transaction": ("recipient",),
        "update_scheduled_transaction": ("recipient",),
        "update_password": ("password",),
    },
    "slack": {
        "send_direct_message": ("recipient",),
        "send_channel_message": ("channel",),
        "add_user_to_channel": ("user", "channel"),
        "invite_user_to_slack": ("user", "user_email"),
        "remove_user_from_slack": ("user",),
        "post_webpage": ("url",),
        "get_webpage": ("url?query",),
    },
    "travel": {
        "send_email": ("recipients", "cc", "bcc"),
        "create_calendar_event": ("participants",),
        "cancel_calendar_event": ("event_id",),
        "reserve_hotel": ("hotel",),
        "reserve_restaurant": ("restaurant",),
        "reserve_car_rental": ("company",),
    },
    "workspace": {
        "send_email": ("recipients", "cc", "bcc"),
        "create_calendar_event": ("participants",),
        "add_calendar_event_participants": ("participants",),
        "share_file": ("email",),
        "delete_file": ("file_id",),
        "delete_email": ("email_id",),
        "cancel_calendar_event": ("event_id",),
    },
}
"""Per suite and tool: the sensitive arguments (``sensitive=(...)``)."""

RECOMMENDED_WITHHELD: dict[str, dict[str, str]] = {
    "banking": {},
    "slack": {
        "remove_user_from_slack": "a member's assistant invites and messages; removing people "
        "is an administrator's act",
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
"""Per suite: the tools ``RECOMMENDED`` withholds, with the reason from the suite's purpose."""


def grant_recommended(suite: str, tools: Sequence[str]) -> frozenset[str]:
    """Every tool of the suite except those :data:`RECOMMENDED_WITHHELD` names."""
    withheld = RECOMMENDED_WITHHELD[suite]
    return frozenset(capability(suite, t) for t in tools if t not in withheld)


def _provenance(suite: str) -> Callable[[fp.ApproverInput], fp.ApproverDecision]:
    return provenance_approver(SENSITIVE[suite], TRUSTED_OUTPUTS[suite])


def provenance_app_data(suite: str, prompt: str, environment: Any) -> dict[str, Any]:
    """The run's ``app_data`` under ``RECOMMENDED``: the user's request and the application's
    own identifiers (the account's IBAN, the workspace's members, the user's own address), the
    trusted sources besides the trusted tools' outputs. Never a counterparty, a contact, a
    host or anything a tool returns."""
    own: list[str] = {
        "banking": lambda env: [env.bank_account.iban],
        "slack": lambda env: list(env.slack.users),
        "travel": lambda env: [env.user.email],
        "workspace": lambda env: [env.inbox.account_email],
    }[suite](environment)
    return {"prompt": prompt, "app": own}


RECOMMENDED = BasePolicy(
    name="recommended",
    summary="trust declared per tool (systems of record trusted, content others write not), "
    "sensitive arguments per tool, least privilege from each suite's purpose, and provenance: "
    "a write or external call whose sensitive argument traces only to untrusted output is "
    "refused (`untrusted_provenance`; a stand-in approver, see `benchmarks/agentdojo/"
    "provenance.py`); no per-tool guards, fencepost's defaults",
    grants=grant_recommended,
    approver=_provenance,
    app_data="provenance",
)

_CALENDAR = frozenset({"search_calendar_events", "get_day_calendar_events"})

TRUSTED_OUTPUTS_REVISED: Mapping[str, frozenset[str]] = {
    # Revised after the first full run showed every workspace leak passing through the calendar:
    # an event's title, description and participants are written by whoever organised it, so
    # the calendar is content others write, as mail is. In-sample for both task sets.
    suite: tools - _CALENDAR
    for suite, tools in TRUSTED_OUTPUTS.items()
}
"""``RECOMMENDED``'s trusted outputs without the calendar (the one revision, after a run)."""


def _provenance_revised(suite: str) -> Callable[[fp.ApproverInput], fp.ApproverDecision]:
    return provenance_approver(SENSITIVE[suite], TRUSTED_OUTPUTS_REVISED[suite])


RECOMMENDED_REVISED = BasePolicy(
    name="recommended-revised",
    summary="`recommended` with the calendar untrusted (revised after its first full run; "
    "in-sample for AgentDojo's and the held-out tasks alike)",
    grants=grant_recommended,
    approver=_provenance_revised,
    app_data="provenance",
)


def declarations(suite: str) -> dict[str, dict[str, Any]]:
    """Per tool, ``recommended-fencepost``'s declarations as ``@fp.tool`` keywords: the revised
    trust and the sensitive arguments. ``get_webpage``'s ``url?query`` has no equivalent in
    fencepost (which traces a URL whole and by its host): it is left undeclared there."""
    out: dict[str, dict[str, Any]] = {
        tool: {"output_trust": fp.Trust.TRUSTED} for tool in TRUSTED_OUTPUTS_REVISED[suite]
    }
    for tool, names in SENSITIVE[suite].items():
        plain = tuple(n for n in names if "?" not in n)
        if plain:
            out.setdefault(tool, {})["sensitive"] = plain
    return out


def _approve_all_writes(suite: str) -> Callable[[fp.ApproverInput], fp.ApproverDecision]:
    return approve_every_write


RECOMMENDED_FENCEPOST = BasePolicy(
    name="recommended-fencepost",
    summary='`recommended-revised` on fencepost\'s own provenance (`provenance="refuse"` on '
    "the graph, `output_trust` and `sensitive` on the tools) instead of the stand-in approver; "
    "`get_webpage` undeclared (fencepost has no query-only sensitivity)",
    grants=grant_recommended,
    approver=_approve_all_writes,
    provenance="refuse",
    app_data="provenance",
)

BASE_POLICIES: tuple[BasePolicy, ...] = (
    PERMISSIVE,
    APPROVER,
    RECOMMENDED,
    RECOMMENDED_REVISED,
    RECOMMENDED_FENCEPOST,
)
"""The policies the report compares: no policy, the old approver, and ``RECOMMENDED``."""
OTHER_POLICIES: tuple[BasePolicy, ...] = (LEAST_PRIVILEGE, LEAST_PRIVILEGE_APPROVER)
"""Kept, but not run by default (``--policy least-privilege`` runs them)."""
DENIALS: tuple[str, ...] = ("end_run", "observe")

ALL_POLICIES: tuple[Policy, ...] = tuple(
    Policy(base, denial) for base in (*BASE_POLICIES, *OTHER_POLICIES) for denial in DENIALS
)
POLICIES: tuple[Policy, ...] = tuple(Policy(base, "observe") for base in BASE_POLICIES)
"""What ``make agentdojo`` runs: each compared policy with denial as data (the run goes on past
a refused call, as the shipped policy did)."""

SHIPPED = "recommended/observe"
"""The policy the targets are checked against."""


def named(names: Sequence[str]) -> tuple[Policy, ...]:
    """The policies with these names (``approver/observe``) or base names (``approver``: both
    modes), in the report's order."""
    wanted = set(names)
    return tuple(p for p in ALL_POLICIES if p.name in wanted or p.base.name in wanted)
