"""Counting the text a model step sends and receives, in tokens.

With ``tiktoken`` installed (and its encoding loadable: tiktoken fetches it once and caches it),
text is counted by its ``o200k_base`` encoding; otherwise at ``usage.CHARACTERS_PER_TOKEN``. The
counter is chosen once per process, when a graph is built, so no node waits on a tokenizer's
download. Counts size a step's hold and charge a step whose model reported no usage it can be
trusted for (see :mod:`fencepost.policy.usage`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from fencepost.policy.usage import text_tokens

__all__ = ["count_tokens", "text_counter"]

_log = logging.getLogger("fencepost.tokens")


def _by_ratio(text: str) -> int:
    return text_tokens(len(text))


@functools.cache
def text_counter() -> Callable[[str], int]:
    """The process's token counter: ``tiktoken``'s when it is installed and loads, else the
    characters-per-token ratio."""
    try:
        # Optional: counted by the ratio without it.
        import tiktoken

        encoding = tiktoken.get_encoding("o200k_base")
    except Exception:
        # Missing, or its encoding cannot be fetched (offline): the ratio counts.
        _log.debug("counting tokens by characters: tiktoken cannot load", exc_info=True)
        return _by_ratio

    def by_encoding(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return by_encoding


def count_tokens(text: str) -> int:
    """Tokens ``text`` counts for (see the module docstring)."""
    return text_counter()(text)
