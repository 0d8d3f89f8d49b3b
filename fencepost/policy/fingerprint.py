"""Canonical fingerprints of proposals, so a repeat is recognised whatever the key order."""

from __future__ import annotations

import hashlib
import json.encoder
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

_ENCODER = json.encoder.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# The C encoder json.dumps builds from these settings, made here without the JSONEncoder and
# iterencode around it. Each call gets its own circular-reference markers (a dict): shared
# markers would make two threads encoding one object see a cycle, and no markers at all find a
# cycle only at the recursion limit, after encoding every level up to it (a wide cyclic dict
# then costs about a thousand times what json.dumps spends refusing it).
_make_encoder: Callable[..., Callable[[Any, int], tuple[str, ...]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)
_SETTINGS = (_ENCODER.default, encode_basestring, None, ":", ",", True, False, False)


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no insignificant whitespace, UTF-8 kept as is.

    The text ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    allow_nan=False)`` gives, and its errors.
    """
    if _make_encoder is None or isinstance(value, str):
        return _ENCODER.encode(value)
    return "".join(_make_encoder({}, *_SETTINGS)(value, 0))


def proposal_fingerprint(tool_name: str, arguments: Any) -> str:
    """sha256 of the canonical JSON of tool name and arguments; holds no argument text."""
    return fingerprint_of(tool_name, canonical_json(arguments))


def fingerprint_of(tool_name: str, canonical_arguments: str) -> str:
    """:func:`proposal_fingerprint` from arguments already in canonical JSON (the gate has
    them for the schema check): the same text ``canonical_json({"tool": ..., "arguments":
    ...})`` gives, as sorted keys put ``arguments`` first."""
    # encode_basestring is what json.dumps(..., ensure_ascii=False) writes for a str.
    canonical = (
        '{"arguments":' + canonical_arguments + ',"tool":' + encode_basestring(tool_name) + "}"
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
MAX_NESTING = 64
"""Deepest nesting of lists and objects a proposal or a tool result may have. LangGraph's
msgpack serializer refuses deep structures at checkpoint time; refusing them here turns that
crash into a typed outcome."""


def fits_checkpoint(value: Any, *, max_depth: int = MAX_NESTING) -> bool:
    """Whether a JSON value can be written to a checkpoint: every integer in the 64-bit range
    msgpack stores, and no deeper than ``max_depth`` (:data:`MAX_NESTING`) levels.

    JSON itself has neither limit, so a model or a tool can produce a value that validates and
    fingerprints fine but that LangGraph's serializer cannot write.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True
