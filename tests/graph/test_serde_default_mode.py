"""fencepost's serializer must revive its types silently in LangGraph's default (non-strict) mode.

Users who never set LANGGRAPH_STRICT_MSGPACK get the permissive default, where LangGraph warns
about every unregistered type it revives. fencepost's allowlist exists so its own types are
registered; `fencepost runs` on a fresh install must not print a warning per type.
LangGraph reads the variable at import, so the check runs in a child interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = r"""
import json, logging
records = []
class Grab(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger().addHandler(Grab())
import fencepost as fp
from fencepost.graph.serde import fencepost_serializer
serde = fencepost_serializer()
state = fp.AgentState(
    run_id="run-1", question="q", budget=fp.RuntimeBudget(steps_remaining=1, tool_calls_remaining=1)
)
back = serde.loads_typed(serde.dumps_typed(state))
print(json.dumps({"type": type(back).__module__ + "." + type(back).__name__, "logged": records}))
"""


def test_serializer_revives_fencepost_types_without_warnings_in_default_mode() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_STRICT_MSGPACK"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["type"] == "fencepost.policy.state.AgentState"
    assert [m for m in report["logged"] if "nregistered" in m or "locked" in m] == []
