"""Exceptions become safe, fixed codes; an exception's text never comes through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.policy import ErrorCode, ToolError, error_code_for, is_retryable

EXCEPTION_TYPES: list[type[BaseException]] = [
    Exception,
    RuntimeError,
    ValueError,
    TypeError,
    KeyError,
    LookupError,
    TimeoutError,
    PermissionError,
    FileNotFoundError,
    ConnectionError,
    ConnectionRefusedError,
    OSError,
    ZeroDivisionError,
    asyncio.CancelledError,
    type("RateLimitError", (Exception,), {}),
    type("APITimeoutError", (Exception,), {}),
    type("AuthenticationError", (Exception,), {}),
    type("ServiceUnavailable", (Exception,), {}),
    type("WeirdProviderError", (Exception,), {}),
]
CODE_VALUES = {code.value for code in ErrorCode}


def _raised(cls: type[BaseException], message: str, status: Any = None) -> BaseException:
    exc = cls(message)
    if status is not None:
        exc.status_code = status  # type: ignore[attr-defined]
    return exc


@settings(max_examples=300, deadline=None)
@given(
    cls=st.sampled_from(EXCEPTION_TYPES),
    message=st.text(min_size=1),
    other=st.text(),
    status=st.none() | st.integers(min_value=100, max_value=599),
)
def test_error_code_never_carries_the_exception_text(
    cls: type[BaseException], message: str, other: str, status: int | None
) -> None:
    secret = f"SECRET:{message}"
    code = error_code_for(_raised(cls, secret, status))
    assert isinstance(code, ErrorCode)
    assert code.value in CODE_VALUES
    assert secret not in code
    # The message plays no part: any other text maps to the same code.
    assert error_code_for(_raised(cls, other, status)) is code


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (TimeoutError("db password=hunter2"), ErrorCode.TIMEOUT),
        (PermissionError("denied"), ErrorCode.PERMISSION_DENIED),
        (FileNotFoundError("/etc/shadow"), ErrorCode.NOT_FOUND),
        (KeyError("k"), ErrorCode.NOT_FOUND),
        (ConnectionResetError("reset"), ErrorCode.UNAVAILABLE),
        (ValueError("bad"), ErrorCode.INVALID_ARGUMENT),
        (asyncio.CancelledError(), ErrorCode.CANCELLED),
        (ZeroDivisionError("x"), ErrorCode.INTERNAL_ERROR),
        (type("RateLimitError", (Exception,), {})("slow down"), ErrorCode.RATE_LIMITED),
        (ToolError(ErrorCode.CONFLICT), ErrorCode.CONFLICT),
    ],
)
def test_exception_types_map_to_their_codes(exc: BaseException, code: ErrorCode) -> None:
    assert error_code_for(exc) is code


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, ErrorCode.INVALID_ARGUMENT),
        (401, ErrorCode.PERMISSION_DENIED),
        (403, ErrorCode.PERMISSION_DENIED),
        (404, ErrorCode.NOT_FOUND),
        (409, ErrorCode.CONFLICT),
        (429, ErrorCode.RATE_LIMITED),
        (500, ErrorCode.UNAVAILABLE),
        (503, ErrorCode.UNAVAILABLE),
        (504, ErrorCode.TIMEOUT),
    ],
)
def test_http_status_maps_to_its_code(status: int, code: ErrorCode) -> None:
    assert error_code_for(_raised(RuntimeError, "body", status)) is code

    class Response:
        status_code = status

    wrapped = RuntimeError("body")
    wrapped.response = Response()  # type: ignore[attr-defined]
    assert error_code_for(wrapped) is code


def test_boolean_status_is_not_a_status() -> None:
    assert error_code_for(_raised(RuntimeError, "x", True)) is ErrorCode.INTERNAL_ERROR


def test_an_exception_whose_attributes_raise_still_gets_a_code() -> None:
    class Unset(RuntimeError):
        @property
        def status_code(self) -> int:
            raise RuntimeError("the .response property has not been set")

        @property
        def response(self) -> Any:
            raise RuntimeError("the .response property has not been set")

    assert error_code_for(Unset("x")) is ErrorCode.INTERNAL_ERROR


def test_tool_error_keeps_its_code_and_only_the_code_as_message() -> None:
    exc = ToolError(ErrorCode.RATE_LIMITED)
    assert str(exc) == "rate_limited"
    assert exc.retryable is True
    assert ToolError(ErrorCode.NOT_FOUND).retryable is False
    assert ToolError(ErrorCode.NOT_FOUND, retryable=True).retryable is True


def test_only_transient_codes_are_retryable() -> None:
    retryable = {code for code in ErrorCode if is_retryable(code)}
    assert retryable == {ErrorCode.RATE_LIMITED, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE}


def test_a_single_failure_wrapped_in_an_exception_group_is_judged_by_itself() -> None:
    group = ExceptionGroup("task group", [TimeoutError("db password=x")])
    assert error_code_for(group) is ErrorCode.TIMEOUT
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [PermissionError("x")])])
    assert error_code_for(nested) is ErrorCode.PERMISSION_DENIED


def test_transport_level_failures_are_unavailable() -> None:
    class ConnectError(Exception):
        pass

    class RemoteProtocolNetworkError(Exception):
        pass

    assert error_code_for(ConnectError("refused")) is ErrorCode.UNAVAILABLE
    assert error_code_for(RemoteProtocolNetworkError("reset")) is ErrorCode.UNAVAILABLE
