"""Hypothesis strategies the suites share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_tree(
    leaves: st.SearchStrategy[Any],
    *,
    max_leaves: int,
    max_size: int = 3,
    keys: st.SearchStrategy[str] | None = None,
) -> st.SearchStrategy[Any]:
    """JSON-shaped values: ``leaves``, and lists and objects of them keyed by ``keys`` (short
    text by default)."""
    keyed_by = keys if keys is not None else st.text(max_size=8)
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=max_size) | st.dictionaries(keyed_by, inner, max_size=max_size)
        ),
        max_leaves=max_leaves,
    )


LONE_SURROGATE = st.characters(categories=["Cs"])
"""One lone surrogate (``"\\ud800"``...): JSON's ``\\uXXXX`` spells it, so any provider's output
or any page may hold one, yet it has no UTF-8 form. Hypothesis's ``text()`` never draws it."""


def unencodable_text(*, min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    """Text holding at least one lone surrogate, anywhere in it, among any other characters."""
    half = max(max_size - 1, 0) // 2
    return st.builds(
        lambda before, odd, after: (before + odd + after).ljust(min_size, "x"),
        st.text(max_size=half),
        LONE_SURROGATE,
        st.text(max_size=half),
    )


def any_text(*, min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    """Text as JSON can carry it: any character hypothesis draws (NUL, line separators, astral
    planes...), and about one time in six a lone surrogate too."""
    ordinary = st.text(min_size=min_size, max_size=max_size)
    odd = unencodable_text(min_size=min_size, max_size=max_size)
    return st.integers(0, 5).flatmap(lambda n: odd if n == 0 else ordinary)


def has_unencodable_text(value: Any) -> bool:
    """Whether a JSON value holds a string or a key with no UTF-8 form."""
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(has_unencodable_text(k) or has_unencodable_text(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_unencodable_text(v) for v in value)
    return False
