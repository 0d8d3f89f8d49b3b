"""Refuse every network connection: the harness must need no model and no network."""

from __future__ import annotations

import socket
from typing import Any


class NetworkUsed(RuntimeError):
    """A socket connection was attempted while the harness ran."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise NetworkUsed("the AgentDojo harness tried to open a network connection")


def offline() -> None:
    """From here on, any socket connection in this process raises :class:`NetworkUsed`: a run
    that finishes made none (AgentDojo's checks, the replay and fencepost included)."""
    socket.socket.connect = _refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = _refuse  # type: ignore[method-assign]
    socket.create_connection = _refuse
