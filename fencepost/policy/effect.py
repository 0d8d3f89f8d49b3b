"""What a tool does to the world: the axis approvals and mutation budgets are keyed on."""

from __future__ import annotations

from enum import StrEnum


class Effect(StrEnum):
    """What a tool does to the world. Only ``READ`` runs without an approval."""

    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"
