"""A STAND-IN for fencepost's provenance rule, as the graph's approver (issue 38).

Fencepost's own provenance (``provenance="refuse"`` on the graph, ``fp.Trust`` on tools) had not
landed when this harness was revised; this module applies the same rule from inside the
harness, as the graph's approver policy, so the ``RECOMMENDED`` policy can be measured now:

    a write or external call whose sensitive arguments trace only to untrusted tool output is
    refused (``untrusted_provenance``).

Where a value was seen before it was proposed, from what the approver is given
(:class:`fp.ApproverInput`): the user's request (``app_data["prompt"]``), the application's own
data (``app_data["app"]``), and each earlier tool output (``observations``, by call id and tool),
trusted when its tool is declared a system of record (:data:`.policies.TRUSTED_OUTPUTS`),
untrusted otherwise. A value the model made up (seen nowhere) is its own: not refused.

Matching is by value, normalised: lower case, whitespace collapsed, a URL's ``www.`` dropped.
An argument is its whole value and the identifiers inside it (email addresses, URL hosts, the
values of a URL's query); it traces only to untrusted output when any of these was seen, and
only in untrusted tool outputs. Limits: a value the model transforms (reformats an IBAN, spells
a number, summarises a secret) escapes it; values shorter than :data:`MIN_TRACED` characters
(small ids, amounts, "10") are everywhere and are not traced; a value seen both in a trusted
source and in an attacker's text counts as trusted (the rule cannot tell which copy the model
used).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import fencepost as fp

UNTRUSTED_PROVENANCE = "untrusted_provenance"
"""The approver's code for a call refused by the rule (the library's code for the same rule)."""

MIN_TRACED = 4
"""Values shorter than this are not traced (ids and amounts occur everywhere)."""

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"(?:https?://)?(?:www\.)?(?:[a-z0-9-]+\.)+[a-z]{2,}(?:/\S*)?", re.IGNORECASE)
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, whitespace collapsed, ``www.`` dropped, surrounding quotes and punctuation
    stripped."""
    text = _SPACE.sub(" ", text.lower()).strip().strip("'\".,;:!?()[]{}<>")
    return text.replace("www.", "")


def identifiers(value: Any, *, query_only: bool = False) -> set[str]:
    """A value's traced parts: itself (normalised) and the identifiers inside it (emails, URL
    hosts, URL query values); with ``query_only``, only its URLs' query values."""
    if isinstance(value, list | tuple):
        return set().union(*(identifiers(v, query_only=query_only) for v in value))
    if isinstance(value, dict):
        return set().union(*(identifiers(v, query_only=query_only) for v in value.values()))
    if value is None or isinstance(value, bool):
        return set()
    text = str(value)
    found = set() if query_only else {normalise(text)}
    if not query_only:
        found.update(normalise(e) for e in _EMAIL.findall(text))
    for match in _URL.finditer(text):
        url = match.group(0)
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.hostname and not query_only:
            found.add(normalise(parts.hostname))
        found.update(normalise(v) for _, v in parse_qsl(parts.query))
    return {f for f in found if len(f) >= MIN_TRACED}


@dataclass(frozen=True)
class Source:
    """Where a value was seen: ``user``, ``app``, or ``tool`` (a call id and its tool)."""

    kind: str
    trusted: bool
    call_id: str | None = None
    tool: str | None = None


def _seen_in(value: str, text: str) -> bool:
    # A whole-token match: "bob" is not in "bobby", an IBAN is not inside a longer one.
    return re.search(r"(?<![\w])" + re.escape(value) + r"(?![\w])", text) is not None


def _text(result: Any) -> str:
    raw = result if isinstance(result, str) else json.dumps(result)
    return normalise(raw.replace("\\n", " "))


def sources(
    value: str,
    *,
    prompt: str,
    app: Iterable[str],
    outputs: Iterable[tuple[str, str, str]],
    trusted_tools: frozenset[str],
) -> list[Source]:
    """Every source of a normalised value: the request, app data, and each (call id, tool,
    normalised output text)."""
    found: list[Source] = []
    if _seen_in(value, prompt):
        found.append(Source("user", True))
    if any(_seen_in(value, a) for a in app):
        found.append(Source("app", True))
    for call_id, tool, text in outputs:
        if _seen_in(value, text):
            found.append(Source("tool", tool in trusted_tools, call_id, tool))
    return found


def untrusted_arguments(
    request: fp.ApproverInput,
    sensitive: Mapping[str, tuple[str, ...]],
    trusted_tools: frozenset[str],
) -> list[str]:
    """The call's sensitive arguments whose value (or an identifier in it) traces only to
    untrusted tool output."""
    names = sensitive.get(request.proposal.tool_name, ())
    if not names:
        return []
    data = request.context.app_data
    prompt = normalise(str(data.get("prompt", "")))
    app = [normalise(str(v)) for v in data.get("app", ())]
    outputs = [
        (o.call_id, o.tool_name, _text(o.result))
        for o in request.observations
        if o.kind == "tool_result"
    ]
    flagged: list[str] = []
    for spec in names:
        # ``url?query``: only the values the URL's query carries.
        name, _, part = spec.partition("?")
        argument = request.proposal.arguments.get(name)
        for value in identifiers(argument, query_only=part == "query"):
            seen = sources(
                value, prompt=prompt, app=app, outputs=outputs, trusted_tools=trusted_tools
            )
            if seen and not any(s.trusted for s in seen):
                flagged.append(spec)
                break
    return flagged


def provenance_approver(
    sensitive: Mapping[str, tuple[str, ...]], trusted_tools: frozenset[str]
) -> Callable[[fp.ApproverInput], fp.ApproverDecision]:
    """The rule as an approver: refuse a call whose sensitive arguments trace only to untrusted
    output, approve the rest."""

    def approve(request: fp.ApproverInput) -> fp.ApproverDecision:
        if untrusted_arguments(request, sensitive, trusted_tools):
            return fp.ApproverDecision.reject(UNTRUSTED_PROVENANCE)
        return fp.ApproverDecision.approve()

    return approve
