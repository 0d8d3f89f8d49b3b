"""The LangGraph binding: state schema, nodes, routing, builder, run context, serializer."""
