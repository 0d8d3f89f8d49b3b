"""Where one value was seen, and how records name it: the unit of provenance.

Kept apart from :mod:`fencepost.policy.provenance` (which traces values) so the records that
name sources — verdicts, receipts, manifests — depend on nothing but the contract base.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Strict

from fencepost.policy.contract import Frozen

Recorded = dict[str, Annotated[tuple[str, ...], Strict(False)]]
"""A provenance as records hold it (:meth:`Provenance.record`): per argument, its sources'
labels (``{"recipient": ("tool:call_3", "user")}``). Read back from a checkpoint's lists."""


class ValueSource(Frozen):
    """One place a value was seen before it was proposed."""

    kind: Literal["user", "app", "tool", "model"]
    """``user``: the run's request; ``app``: ``RunContext.app_data``; ``tool``: an earlier call's
    output; ``model``: nowhere (or a value too short to trace)."""
    call_id: str | None = None
    """With ``tool``: the call whose output held the value."""
    tool: str | None = None
    """With ``tool``: the registered tool that produced that output."""
    trusted: bool
    """Whether the source is trusted: the user, the app data and a tool declared
    ``output_trust=Trust.TRUSTED`` are; an untrusted tool and the model are not."""

    @property
    def label(self) -> str:
        """How records name the source: ``user``, ``app``, ``model`` or ``tool:<call id>``."""
        return f"tool:{self.call_id}" if self.kind == "tool" else self.kind

    @property
    def untrusted_output(self) -> bool:
        """Whether this is the output of a tool that did not declare its output trusted."""
        return self.kind == "tool" and not self.trusted


USER = ValueSource(kind="user", trusted=True)
"""The run's request."""
APP = ValueSource(kind="app", trusted=True)
"""The run's trusted ``app_data``."""
MODEL = ValueSource(kind="model", trusted=False)
"""Nowhere: the model's own value (or one too short to trace)."""
