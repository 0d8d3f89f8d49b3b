"""Canonical fingerprints of proposals, so a repeat is recognised whatever the key order."""

from __future__ import annotations

import hashlib
import json.encoder
import re
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
    # surrogatepass: a lone surrogate (valid JSON, "\ud800") has no UTF-8 form. Arguments
    # holding one never reach a checkpoint (:func:`fits_checkpoint` refuses them), but a
    # fingerprint is asked for before that is known, and must not raise.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
MAX_NESTING = 64
"""Deepest nesting of lists and objects a proposal or a tool result may have. LangGraph's
msgpack serializer refuses deep structures at checkpoint time; refusing them here turns that
crash into a typed outcome."""


def encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form: it holds no lone surrogate (``"\\ud800"``).

    JSON's ``\\uXXXX`` escapes can spell one, so any provider's JSON may carry it, yet no
    checkpoint stores it as it is: LangGraph's serializer turns it into ``?`` in a value (so what
    a run reads back is not what it checked) and refuses it in a key, and encoding it as UTF-8
    (a hash, a text column) raises.
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def fits_checkpoint(value: Any, *, max_depth: int = MAX_NESTING) -> bool:
    """Whether a JSON value can be written to a checkpoint as it is: every integer in the
    64-bit range msgpack stores, every string and key :func:`encodable`, and no deeper than
    ``max_depth`` (:data:`MAX_NESTING`) levels.

    JSON itself has none of these limits, so a model or a tool can produce a value that
    validates as JSON but that LangGraph's serializer cannot write (or writes changed).
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, str):
            if not encodable(item):
                return False
        elif isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return False
            if isinstance(item, dict):
                if not all(encodable(k) for k in item if isinstance(k, str)):
                    return False
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
"""What :func:`with_encodable_text` puts in place of each character with no UTF-8 form."""


def with_encodable_text(value: Any, *, max_depth: int = MAX_NESTING) -> Any:
    """``value`` with every lone surrogate in its strings and keys replaced by U+FFFD
    (:data:`REPLACEMENT`), as a UTF-8 decoder shows a byte it cannot read. For untrusted data
    (a tool's result): one bad character of a page need not cost the whole of it.

    Levels deeper than ``max_depth`` are returned as they are (:func:`fits_checkpoint` refuses
    them). Keys that become one keep the last value.
    """
    if isinstance(value, str):
        return value if encodable(value) else _SURROGATE.sub(REPLACEMENT, value)
    if max_depth <= 0:
        return value
    if isinstance(value, dict):
        return {
            with_encodable_text(k, max_depth=0): with_encodable_text(v, max_depth=max_depth - 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [with_encodable_text(v, max_depth=max_depth - 1) for v in value]
    return value
