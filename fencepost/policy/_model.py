"""The base every contract type shares: frozen, strict, no extra keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Frozen, strict pydantic model with extra keys forbidden.

    Fields that must survive a LangGraph checkpoint (tuples come back as lists, enums as their
    values) are annotated with ``Strict(False)`` one by one, so pydantic re-validates them on load
    instead of LangGraph falling back to ``model_construct``.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")
