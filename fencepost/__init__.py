"""fencepost: tool-calling agents on LangGraph as a bounded loop that ends with a typed reason."""

from fencepost.graph import *  # noqa: F403
from fencepost.graph import __all__ as _graph_all
from fencepost.policy import *  # noqa: F403
from fencepost.policy import __all__ as _policy_all

__all__ = [*_policy_all, *_graph_all]
