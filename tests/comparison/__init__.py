"""Side-by-side tests: LangChain's ``create_agent`` and fencepost on the same scenarios."""
