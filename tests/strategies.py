"""Hypothesis strategies the suites share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_tree(
    leaves: st.SearchStrategy[Any], *, max_leaves: int, max_size: int = 3
) -> st.SearchStrategy[Any]:
    """JSON-shaped values: ``leaves``, and lists and string-keyed objects of them."""
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=max_size)
            | st.dictionaries(st.text(max_size=8), inner, max_size=max_size)
        ),
        max_leaves=max_leaves,
    )
