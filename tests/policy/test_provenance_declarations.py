"""Trust is declared, not guessed: a tool's output is untrusted unless it says otherwise, and the
arguments it calls sensitive must be its own — checked when the tool is defined."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool as lc_tool
from pydantic import BaseModel, ConfigDict, ValidationError

import fencepost as fp
from fencepost.adapters import ToolAdapterError
from fencepost.policy.tool_decorator import ToolDefinitionError


def send_money(recipient: str, amount: float) -> dict[str, str]:
    """Send money to an IBAN."""
    return {"status": "sent"}


def test_a_tool_output_is_untrusted_unless_declared() -> None:
    spec = fp.tool(send_money, effect="write", capability="bank:pay")
    assert spec.output_trust is fp.Trust.UNTRUSTED
    assert spec.sensitive == ()
    declared = fp.tool(
        send_money,
        effect="write",
        capability="bank:pay",
        output_trust=fp.Trust.TRUSTED,
        sensitive=("recipient", "amount"),
    )
    assert declared.output_trust is fp.Trust.TRUSTED
    assert declared.sensitive == ("recipient", "amount")
    assert fp.tool(send_money, effect="read", capability="x", output_trust="trusted").output_trust


def test_a_sensitive_name_that_is_no_parameter_is_refused_naming_it() -> None:
    with pytest.raises(ToolDefinitionError, match=r"sensitive.*'payee'"):
        fp.tool(send_money, effect="write", capability="bank:pay", sensitive=("payee",))
    with pytest.raises(ToolDefinitionError, match=r"sensitive must be a tuple"):
        fp.tool(send_money, effect="write", capability="bank:pay", sensitive="recipient")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="output_trust"):
        fp.tool(send_money, effect="write", capability="bank:pay", output_trust="maybe")


def test_a_tool_spec_checks_its_sensitive_names_against_its_arguments() -> None:
    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        recipient: str

    def make(sensitive: tuple[str, ...]) -> fp.ToolSpec:
        return fp.ToolSpec(
            name="pay",
            description="Pay.",
            args_model=Args,
            effect="write",
            capability="bank:pay",
            execute=lambda a, c: None,
            sensitive=sensitive,
        )

    assert make(("recipient",)).sensitive == ("recipient",)
    with pytest.raises(ValidationError) as raised:
        make(("amount",))
    assert raised.value.errors()[0]["loc"] == ("sensitive",)


def test_a_langchain_tool_carries_trust_and_sensitive_arguments() -> None:
    @lc_tool
    def post_webpage(url: str, content: str) -> str:
        """Post content to a URL."""
        return "ok"

    spec = fp.tool(
        post_webpage,
        effect="external",
        capability="web:post",
        output_trust=fp.Trust.TRUSTED,
        sensitive=("url",),
    )
    assert spec.output_trust is fp.Trust.TRUSTED and spec.sensitive == ("url",)
    with pytest.raises(ToolAdapterError, match=r"sensitive.*'audience'"):
        fp.tool(post_webpage, effect="external", capability="web:post", sensitive=("audience",))
    with pytest.raises(ToolAdapterError, match="output_trust"):
        fp.tool(post_webpage, effect="external", capability="web:post", output_trust="half")
