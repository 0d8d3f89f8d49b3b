"""Edges to other ecosystems: chat models, tools, checkpointers, durable ledgers."""
