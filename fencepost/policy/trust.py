"""Trust, declared: whether a tool's output is the application's own record or others' content.

A tool declares it (``@fp.tool(..., output_trust=fp.Trust.TRUSTED)``); nothing is guessed from
a tool's name or its output. Untrusted is the default: mail, messages, web pages, shared files
and transaction descriptions are written by people other than the user, and a value the model
copies out of them may have been put there by an attacker. Trusted is a system of record the
application controls (its own customer table, the user's own account settings). The run's
``RunContext.app_data`` is trusted as the rest of the context is; the user's request is the
user's. :mod:`fencepost.policy.provenance` traces argument values to these sources.

>>> Trust("trusted") is Trust.TRUSTED
True
"""

from __future__ import annotations

from enum import StrEnum


class Trust(StrEnum):
    """Whether a tool's output may be relied on as the application's own data."""

    TRUSTED = "trusted"
    """A system of record the application controls: its values are as good as ``app_data``."""
    UNTRUSTED = "untrusted"
    """Content others may write (the default): a value seen only there is the attacker's as
    much as the user's."""
