"""fencepost: tool-calling agents on LangGraph as a bounded loop that always ends with a typed reason."""

from fencepost.policy import *  # noqa: F403
from fencepost.policy import __all__ as _policy_all

__all__ = [*_policy_all]
