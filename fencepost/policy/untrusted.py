"""How an observation is shown to anyone who reads it: untrusted data in a JSON block.

One rendering, used where a model is shown the run (the chat-model adapter) and where a person
or a chat UI is (the graph's ``messages`` view), so the two can never drift apart. A result is
wrapped under a single key that marks it as data; a failure shows its safe code only, never the
exception's text.
"""

from __future__ import annotations

import json

from fencepost.policy.observation import Observation

UNTRUSTED_KEY = "untrusted_tool_output"
"""The single key a tool result is wrapped in when it is shown."""
ERROR_KEY = "tool_error"
"""The key a tool failure's safe code is shown under."""


def observation_content(observation: Observation) -> str:
    """One observation as shown: a data block, or the failure's safe code."""
    if observation.kind == "tool_result":
        return json.dumps({UNTRUSTED_KEY: observation.result}, ensure_ascii=False)
    code = observation.error_code.value if observation.error_code is not None else "unknown"
    return json.dumps({ERROR_KEY: code, "retryable": observation.retryable})
