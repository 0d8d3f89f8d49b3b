"""A real MCP server for the tests: streamable HTTP on 127.0.0.1, in a thread, with tools that
read, write and fail. Started and stopped by the ``mcp_server`` fixture in test_mcp_tools.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SECRET = "db-password=hunter2 at /srv/notes.py line 12"
"""Text the failing tool puts in its MCP error; it must never reach the model or the state."""


@dataclass
class NoteStore:
    """The server's world: notes, and a log of every write (to count effects)."""

    notes: dict[str, str] = field(default_factory=lambda: {"deploy-42": "rolled back at 10:02"})
    writes: list[tuple[str, str]] = field(default_factory=list)


def build_server(store: NoteStore):  # type: ignore[no-untyped-def]
    from mcp.server.fastmcp import FastMCP

    server = FastMCP(
        "notes", host="127.0.0.1", stateless_http=True, json_response=True, log_level="ERROR"
    )

    @server.tool()
    def get_note(key: str) -> str:
        """Read a note by key."""
        if key not in store.notes:
            raise ValueError(f"no note {key}; {SECRET}")
        return store.notes[key]

    @server.tool()
    def put_note(key: str, text: str, tenant_id: str = "") -> dict[str, str]:
        """Write a note."""
        store.notes[key] = text
        store.writes.append((key, tenant_id))
        return {"stored": key, "tenant": tenant_id}

    @server.tool()
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"{reason}: {SECRET}")

    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_mcp_server(store: NoteStore) -> Iterator[str]:
    """Serve the MCP app on a free loopback port; yields its URL and stops it on exit."""
    import uvicorn

    port = _free_port()
    app = build_server(store).streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="mcp-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("MCP test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
