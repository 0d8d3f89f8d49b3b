"""Developer logs: what raised, with its traceback, on the ``fencepost`` logger hierarchy.

Invariant 6 keeps exception text out of every checkpoint, model input, stream, manifest and span:
a failure becomes a safe code there. The developer who wrote the failing tool still needs the
traceback, and this is the one place it goes. Standard library ``logging`` only, silent until
the application configures logging (the package's logger has a ``NullHandler``)::

    import logging
    logging.basicConfig(level=logging.INFO)  # or WARNING: the tracebacks only

What is logged, once each, on loggers named for what they report (stable names to filter on):

- ``fencepost.tools``: a tool body that raised (WARNING, with its traceback), and each call that
  did not succeed, with its receipt and code (INFO; DEBUG for a success or a ``ToolError``, the
  tool's own typed report).
- ``fencepost.model``: a decision model that raised (WARNING, with its traceback); a failed step
  and whether it is retried (INFO).
- ``fencepost.gate``: an arguments validator, semantic validator or progress predicate that
  raised (WARNING, with its traceback); each refused call with its verdict (INFO), a call
  refused for a capability naming the capability the principal lacks (in the message and as
  the record attribute ``capability``: trusted configuration, never shown to the model).
- ``fencepost.approval``: an approver policy that raised (WARNING, with its traceback); an
  answer refused and asked again (WARNING, its code only); calls waiting for a human, and each
  answer, a human's or the approver's (INFO).
- ``fencepost.run``: how each run ended (INFO), budget stops and cancels included, and a call
  retried after a crash (INFO).

Each record carries the run id, the call id (``-`` for none) and the safe code in its message
and as the record attributes ``run_id``, ``call_id`` and ``code`` (for a structured handler).
The traceback rides on ``exc_info`` and nowhere else: a message never quotes an exception, an
argument or a result.
"""

from __future__ import annotations

import logging
import traceback
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "APPROVAL",
    "GATE",
    "MODEL",
    "RUN",
    "TOOLS",
    "CallScope",
    "current_call",
    "formattable",
    "raised",
]

TOOLS = logging.getLogger("fencepost.tools")
"""Tool bodies: what raised (WARNING) and how each call ended (INFO, DEBUG)."""
MODEL = logging.getLogger("fencepost.model")
"""The decision model: what raised (WARNING), failed steps and retries (INFO)."""
GATE = logging.getLogger("fencepost.gate")
"""Validators and predicates that raised (WARNING); refused calls (INFO)."""
APPROVAL = logging.getLogger("fencepost.approval")
"""An approver that raised (WARNING); calls waiting for a human, and the answers (INFO)."""
RUN = logging.getLogger("fencepost.run")
"""How runs ended, and calls retried after a crash (INFO)."""


@dataclass(frozen=True, slots=True)
class CallScope:
    """The tool call a body runs for: what a failure logged from inside it is attributed to."""

    run_id: str
    call_id: str
    tool: str
    """The registered tool name."""


current_call: ContextVar[CallScope | None] = ContextVar("fencepost_current_call", default=None)
"""Set by the runtime around each tool body (in the body's own context), so an adapter that
turns a tool's exception into a safe code (LangChain tools) logs it under the right run and call."""


def raised(
    logger: logging.Logger,
    what: str,
    exc: BaseException,
    *,
    run_id: str | None,
    call_id: str | None,
    code: str,
) -> None:
    """Log ``exc``, which ``what`` raised, once: WARNING, with its traceback as ``exc_info``.

    The message names the exception's type, never its text: a handler that prints tracebacks
    shows the text to the developer, and nothing else in the package ever does. An exception
    that raises as it is formatted (:func:`formattable`) is logged without it: a log line never
    lets what an application raised escape the runtime.
    """
    if not logger.isEnabledFor(logging.WARNING):
        return
    shown: BaseException | None = exc
    name = type(exc).__name__ if formattable(exc) else None
    if name is None:
        shown, name = None, "an exception no log can format"
    logger.warning(
        "%s raised %s (run %s, call %s): recorded as %s",
        what,
        name,
        run_id or "-",
        call_id or "-",
        code,
        exc_info=shown,
        extra={"run_id": run_id, "call_id": call_id, "code": code},
    )


def formattable(exc: BaseException) -> bool:
    """Whether a log handler can show ``exc`` as :func:`raised` logs it: its type's name and its
    traceback, notes and chained exceptions formatted. Formatting reads the exception (a
    ``__notes__`` or ``__cause__`` property, a metaclass's ``__name__``), which is the code of
    whoever raised it: a probe that catches whatever formatting raises. Formatting twice costs
    a failure's log line, never a step that succeeded."""
    try:
        str.__str__(type(exc).__name__)
        traceback.format_exception(exc)
    except BaseException:  # whatever formatting raised is the exception's own code
        return False
    return True
