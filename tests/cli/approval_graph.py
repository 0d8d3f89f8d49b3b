"""A graph for the approver commands' tests: it proposes one note (a write that needs a human's
approval), then answers. Named with ``--graph tests.cli.approval_graph:graph``; ``written`` logs
every note the tool really wrote, so a test sees a call run once or never."""

from __future__ import annotations

from typing import Any

import fencepost as fp
from fencepost.policy.tool_decorator import tool

written: list[str] = []


@tool(effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=5)
def write_note(note: str, ctx: fp.ToolContext) -> Any:
    """Write a note."""
    written.append(ctx.idempotency_key)
    return {"written": True}


class OneNote:
    """Propose the note first; once something was observed, answer."""

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        if not input.observations:
            return fp.ToolProposal(
                call_id="call-0001", tool_name="write_note", arguments={"note": "restart api"}
            )
        return fp.FinalProposal(answer=fp.AnswerPayload(text="done"))


graph = fp.build_agent_graph(fp.ToolRegistry([write_note]), OneNote(), approval="interrupt")
"""Uncompiled: the CLI compiles it with the checkpoint database's saver (and its ledger)."""
