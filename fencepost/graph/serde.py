"""``fencepost_serializer``: no longer needed, kept for one release.

Checkpoints hold plain data and LangChain messages only (:mod:`fencepost.graph.record`), so any
LangGraph saver with its default serializer, strict or not, stores and revives a run without an
allowlist and without a warning. Earlier versions stored fencepost's records as msgpack extension
types and needed ``serde=fencepost_serializer()`` on every saver; code that still passes it keeps
working, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


def fencepost_serializer(base: SerializerProtocol | None = None) -> SerializerProtocol:
    """Deprecated: returns ``base`` (LangGraph's default serializer without one) unchanged.

    A checkpoint holds only plain data and LangChain messages, so a saver needs no serializer of
    fencepost's: ``InMemorySaver()``, ``SqliteSaver(conn)`` and ``PostgresSaver(conn)`` as they
    come. Remove the ``serde=fencepost_serializer()`` argument; this function goes in the next
    release.
    """
    warnings.warn(
        "fencepost_serializer() is no longer needed: checkpoints hold plain data, so drop the "
        "serde= argument (the function goes in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return base if base is not None else JsonPlusSerializer()
