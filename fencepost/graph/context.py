"""The trusted run context lives in the policy layer; the graph binding re-exports it."""

from fencepost.policy.context import RunContext, coerce_context

__all__ = ["RunContext", "coerce_context"]
