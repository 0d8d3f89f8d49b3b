"""An OpenAI-compatible Chat Completions server on 127.0.0.1 that replays scripted responses.

Built on the standard library's ``http.server``. Each POST to ``/v1/chat/completions`` gets the
next entry of the script (a JSON body with a status and headers, or a server-sent-event stream)
and its request body is recorded, so a test can check exactly what the client sent. The replies
below are written in the Chat Completions wire format (ids, ``choices``, ``finish_reason``,
``usage``, ``refusal``) as the API returns it; nothing here reaches the internet.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "gpt-4.1-mini-2025-04-14"


@dataclass
class Reply:
    """One scripted HTTP response."""

    body: dict[str, Any] | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    stream: list[dict[str, Any]] | None = None
    """Server-sent-event chunks instead of a JSON body."""
    done: bool = True
    """Whether a stream ends with ``data: [DONE]`` (False: the connection just closes)."""


def completion(
    message: dict[str, Any],
    *,
    finish_reason: str = "stop",
    n: int = 1,
    tokens: tuple[int, int] = (120, 30),
) -> dict[str, Any]:
    """A ``chat.completion`` object, as the API returns it."""
    return {
        "id": f"chatcmpl-replay{n:04d}",
        "object": "chat.completion",
        "created": 1767225600,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": None, **message},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": tokens[0],
            "completion_tokens": tokens[1],
            "total_tokens": tokens[0] + tokens[1],
        },
        "system_fingerprint": "fp_replay",
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of ``message.tool_calls``; ``arguments`` is the raw JSON text the model wrote."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_calls_reply(*calls: dict[str, Any], n: int = 1) -> Reply:
    return Reply(completion({"tool_calls": list(calls)}, finish_reason="tool_calls", n=n))


def text_reply(text: str, *, n: int = 1) -> Reply:
    return Reply(completion({"content": text}, n=n))


def refusal_reply(text: str = "I'm sorry, but I can't help with that request.") -> Reply:
    return Reply(completion({"refusal": text}))


def rate_limited_reply(secret: str = "") -> Reply:
    return Reply(
        {
            "error": {
                "message": f"Rate limit reached for requests. {secret}",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
        status=429,
        # The openai client honours retry-after-ms: a retry waits 10 ms, not seconds.
        headers={"retry-after-ms": "10", "x-ratelimit-remaining-requests": "0"},
    )


def stream_chunks(call_id: str, name: str, argument_parts: list[str]) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` events for one tool call, with no ``finish_reason`` chunk."""
    base = {
        "id": "chatcmpl-replaystream",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": MODEL,
    }
    first = {
        **base,
        "choices": [
            {
                "index": 0,
                "delta": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ],
                },
                "finish_reason": None,
            }
        ],
    }
    rest = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": part}}]},
                    "finish_reason": None,
                }
            ],
        }
        for part in argument_parts
    ]
    return [first, *rest]


def text_stream(text: str) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` events for a complete text answer."""
    base = {
        "id": "chatcmpl-replaytext",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": MODEL,
    }
    return [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
            ],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]


class ReplayServer:
    """The running server: its base URL, the script left, and every request body received."""

    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.base_url = ""

    def next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return Reply(
                    {"error": {"message": "replay script exhausted", "type": "server_error"}},
                    status=500,
                )
            return self.script.pop(0)


def _handler(server: ReplayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.endswith("/chat/completions"):
                self.send_error(404)
                return
            reply = server.next_reply(body)
            if reply.stream is not None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in reply.stream:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if reply.done:
                    self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
                return
            payload = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def replay_server(script: list[Reply]) -> Iterator[ReplayServer]:
    """Serve ``script`` on a free 127.0.0.1 port; the server stops when the block ends."""
    state = ReplayServer(script)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
