"""The fixed vocabulary of safe error codes, and the one mapping from exceptions to it.

Nothing here ever reads an exception's message: a tool's or provider's text may hold secrets,
stack traces or instructions, and none of that may reach the model, the trace or a checkpoint.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum


class ErrorCode(StrEnum):
    """A safe, fixed error code. The only error detail a model or a trace ever sees."""

    RATE_LIMITED = "rate_limited"
    NOT_FOUND = "not_found"
    INVALID_ARGUMENT = "invalid_argument"
    TIMEOUT = "timeout"
    PERMISSION_DENIED = "permission_denied"
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    CANCELLED = "cancelled"
    EXECUTION_UNCERTAIN = "execution_uncertain"
    DEPENDENCY_FAILED = "dependency_failed"
    """A call this one depends on did not produce a verified result: this one never ran."""
    INCOMPLETE = "incomplete"
    """The call ran and reported, but the work it was asked for was not done (a child run that
    ended without completing): its result says why, as data."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    UNSERIALIZABLE_RESULT = "unserializable_result"
    INTERNAL_ERROR = "internal_error"


_RETRYABLE = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE})


def is_retryable(code: ErrorCode) -> bool:
    """Whether trying the same call again later may succeed."""
    return code in _RETRYABLE


class ToolError(Exception):
    """Raise from a tool to report a specific safe code.

    Example: ``raise ToolError(ErrorCode.NOT_FOUND)``. The message is never shown to the model.
    """

    def __init__(self, code: ErrorCode, *, retryable: bool | None = None) -> None:
        super().__init__(code.value)
        self.code = code
        self.retryable = is_retryable(code) if retryable is None else retryable


_BY_STATUS = {
    400: ErrorCode.INVALID_ARGUMENT,
    401: ErrorCode.PERMISSION_DENIED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    408: ErrorCode.TIMEOUT,
    409: ErrorCode.CONFLICT,
    422: ErrorCode.INVALID_ARGUMENT,
    429: ErrorCode.RATE_LIMITED,
    504: ErrorCode.TIMEOUT,
}

# Checked in order; the first class the exception is an instance of wins.
_BY_TYPE: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (ToolError, ErrorCode.INTERNAL_ERROR),  # handled before this table; listed for completeness
    (asyncio.CancelledError, ErrorCode.CANCELLED),
    (TimeoutError, ErrorCode.TIMEOUT),
    (PermissionError, ErrorCode.PERMISSION_DENIED),
    (FileNotFoundError, ErrorCode.NOT_FOUND),
    (LookupError, ErrorCode.NOT_FOUND),
    (ConnectionError, ErrorCode.UNAVAILABLE),
    (ValueError, ErrorCode.INVALID_ARGUMENT),
    (TypeError, ErrorCode.INVALID_ARGUMENT),
)

_BY_NAME = (
    ("ratelimit", ErrorCode.RATE_LIMITED),
    ("timeout", ErrorCode.TIMEOUT),
    ("timedout", ErrorCode.TIMEOUT),
    ("notfound", ErrorCode.NOT_FOUND),
    ("permission", ErrorCode.PERMISSION_DENIED),
    ("authentication", ErrorCode.PERMISSION_DENIED),
    ("unavailable", ErrorCode.UNAVAILABLE),
    ("connection", ErrorCode.UNAVAILABLE),
    ("connect", ErrorCode.UNAVAILABLE),
    ("network", ErrorCode.UNAVAILABLE),
    ("transport", ErrorCode.UNAVAILABLE),
)


def _attr(obj: object, name: str) -> object:
    # Some client errors expose these as properties that raise when unset; mapping must not fail.
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status_code", "status", "http_status"):
        value = _attr(exc, attr)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    value = _attr(_attr(exc, "response"), "status_code")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_code_for(exc: BaseException) -> ErrorCode:
    """Map any exception to a safe code, looking at its type, HTTP status and class names only.

    >>> error_code_for(TimeoutError("db password=hunter2"))
    <ErrorCode.TIMEOUT: 'timeout'>
    """
    # A task group wraps one failure in a group (MCP clients do): judge the failure itself.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, ToolError):
        return exc.code
    # Exception classes of our own declare their code on the class, never in the message.
    declared = getattr(type(exc), "safe_code", None)
    if isinstance(declared, ErrorCode):
        return declared
    status = _status_of(exc)
    if status is not None:
        if status in _BY_STATUS:
            return _BY_STATUS[status]
        if 500 <= status < 600:
            return ErrorCode.UNAVAILABLE
    for name in (cls.__name__.lower() for cls in type(exc).__mro__):
        for needle, code in _BY_NAME:
            if needle in name:
                return code
    for cls, code in _BY_TYPE[1:]:
        if isinstance(exc, cls):
            return code
    return ErrorCode.INTERNAL_ERROR


def failure_code_for(exc: BaseException) -> ErrorCode:
    """The safe code for what a tool's body raised, in either binding.

    An ``Exception`` is a tool reporting a failure (:func:`error_code_for`); anything else
    (``SystemExit``, ``KeyboardInterrupt``, an application's own ``BaseException``) is control
    flow escaping it: ``internal_error``.
    """
    return error_code_for(exc) if isinstance(exc, Exception) else ErrorCode.INTERNAL_ERROR
