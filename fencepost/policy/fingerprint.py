"""Canonical fingerprints of proposals, so a repeat is recognised whatever the key order."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no insignificant whitespace, UTF-8 kept as is."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def proposal_fingerprint(tool_name: str, arguments: Any) -> str:
    """sha256 of the canonical JSON of tool name and arguments; holds no argument text."""
    canonical = canonical_json({"tool": tool_name, "arguments": arguments})
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def fits_checkpoint(value: Any) -> bool:
    """Whether every integer in a JSON value fits the 64-bit range a checkpoint can store.

    JSON itself has no integer limit, so a model or a tool can produce a number that validates
    and fingerprints fine but that LangGraph's msgpack serializer cannot write.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True
