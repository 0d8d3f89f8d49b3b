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
