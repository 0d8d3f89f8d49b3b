"""The demo graph served by ``langgraph dev`` (LangGraph Server, in-memory) and driven through
``langgraph-sdk``, the way a deployment's clients reach it.

One server per module: started from the repository's own ``langgraph.json`` on a free loopback
port (``--no-reload``, so edits elsewhere in the tree never restart it mid-test), with a bounded
wait for it to answer, and always stopped — its whole process group — at teardown. It runs in a
scratch directory (the server keeps its dev state in ``./.langgraph_api``), which holds the
repository's ``langgraph.json`` with one graph added (``fencepost_chat``, an agent over a streaming
chat model: ``chat_graph.py``, copied beside it) and a link to the package.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph_api", reason="needs langgraph-cli[inmem] (the dev extra)")
langgraph_sdk = pytest.importorskip("langgraph_sdk", reason="needs langgraph-sdk (the dev extra)")

from fencepost.demo import DEMO_CAPABILITIES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GRAPH = "fencepost_demo"
CHAT_GRAPH = "fencepost_chat"
STARTUP_SECONDS = 90.0
CONTEXT = {
    "tenant_id": "acme",
    "principal": {"id": "oncall-ana", "capabilities": sorted(DEMO_CAPABILITIES)},
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ok", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    # The server was started in its own session: its process group is ours to end, and only it.
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("langgraph-dev")
    config = json.loads((ROOT / "langgraph.json").read_text(encoding="utf-8"))
    config["graphs"][CHAT_GRAPH] = "./chat_graph.py:graph"
    (workdir / "langgraph.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copyfile(Path(__file__).with_name("chat_graph.py"), workdir / "chat_graph.py")
    (workdir / "fencepost").symlink_to(ROOT / "fencepost", target_is_directory=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        # The hardest case: the server's serializer revives none of fencepost's types.
        "LANGGRAPH_STRICT_MSGPACK": "true",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
    }
    command = [
        sys.executable,
        "-m",
        "langgraph_cli",
        "dev",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-browser",
        "--no-reload",
        "--config",
        "langgraph.json",
    ]
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"langgraph dev did not start (exit {process.poll()}):\n{tail}")
            time.sleep(0.25)
        yield url
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    return langgraph_sdk.get_sync_client(url=server, api_key=None)


@pytest.fixture(scope="module")
def assistant(client: Any) -> str:
    found = client.assistants.search(graph_id=GRAPH)
    assert found, "the server did not register the demo graph from langgraph.json"
    return str(found[0]["assistant_id"])


def _values(client: Any, thread_id: str) -> dict[str, Any]:
    return dict(client.threads.get_state(thread_id)["values"])


def test_the_server_publishes_the_input_and_context_schemas(client: Any, assistant: str) -> None:
    schemas = client.assistants.get_schemas(assistant)
    assert set(schemas["input_schema"]["properties"]) == {"request", "messages"}
    request = schemas["input_schema"]["$defs"]["StartRequest"]
    assert request["required"] == ["question"]
    context = schemas["context_schema"]
    assert set(context["properties"]) == {
        "tenant_id",
        "principal",
        "deadline",
        "budget_account",
        "app_data",
    }
    assert sorted(context["required"]) == ["principal", "tenant_id"]


def test_a_run_with_wait_completes_with_cited_evidence(client: Any, assistant: str) -> None:
    thread = client.threads.create()
    out = client.runs.wait(
        thread["thread_id"],
        assistant,
        input={"request": {"question": "Why is checkout returning 500s since 14:00?"}},
        context=CONTEXT,
    )
    assert out["run"]["termination"] == "completed"
    assert [o["tool_name"] for o in out["run"]["observations"]] == [
        "search_logs",
        "deployment_history",
    ]
    assert set(out["run"]["final_answer"]["citations"]) == {
        o["call_id"] for o in out["run"]["observations"]
    }
    kinds = [m["type"] for m in out["messages"]]
    assert kinds == ["human", "ai", "tool", "ai", "tool", "ai"]
    assert out["messages"][-1]["content"] == out["run"]["final_answer"]["text"]


def test_messages_input_runs_with_the_default_budget(client: Any, assistant: str) -> None:
    thread = client.threads.create()
    out = client.runs.wait(
        thread["thread_id"],
        assistant,
        input={"messages": [{"role": "user", "content": "Why are order lookups timing out?"}]},
        context=CONTEXT,
    )
    assert out["run"]["termination"] == "completed"
    assert out["run"]["question"] == "Why are order lookups timing out?"
    budget = out["run"]["budget"]
    assert budget["steps_remaining"] + budget["steps_used"] == 8
    assert [m["type"] for m in out["messages"]] == ["human", "ai", "tool", "ai", "tool", "ai"]


@pytest.mark.parametrize(
    ("context", "code"),
    [
        (None, "missing_context"),
        ({}, "missing_context"),
        ({"tenant_id": "acme"}, "invalid_context"),
        ({"tenant_id": "acme", "principal": "oncall-ana"}, "invalid_context"),
    ],
)
def test_a_run_with_a_missing_or_malformed_context_ends_policy_denied(
    client: Any, assistant: str, context: Any, code: str
) -> None:
    thread = client.threads.create()
    out = client.runs.wait(
        thread["thread_id"],
        assistant,
        input={"request": {"question": "Why is checkout returning 500s?"}},
        context=context,
    )
    assert out["run"]["termination"] == "policy_denied"
    assert out["run"]["last_error_code"] == code
    assert out["run"]["observations"] == []


def test_a_stream_carries_manifests_and_node_updates(client: Any, assistant: str) -> None:
    thread = client.threads.create()
    parts = list(
        client.runs.stream(
            thread["thread_id"],
            assistant,
            input={"request": {"question": "Why is checkout returning 500s since 14:00?"}},
            context=CONTEXT,
            stream_mode=["custom", "updates"],
        )
    )
    manifests = [p.data for p in parts if p.event == "custom"]
    assert manifests and all(m["fencepost"] == "manifest" for m in manifests)
    assert manifests[-1]["outcome"] == "terminal" and manifests[-1]["code"] == "completed"
    nodes = [next(iter(p.data)) for p in parts if p.event == "updates"]
    assert nodes == ["decide", "execute", "decide", "execute", "decide", "terminal"]
    assert _values(client, thread["thread_id"])["run"]["termination"] == "completed"


def test_an_approval_interrupt_is_resumed_through_the_sdk(client: Any, assistant: str) -> None:
    thread = client.threads.create()
    thread_id = thread["thread_id"]
    paused = client.runs.wait(
        thread_id,
        assistant,
        input={"request": {"question": "orders-api is stuck, restart it."}},
        context=CONTEXT,
    )
    assert paused["run"]["termination"] is None
    state = client.threads.get_state(thread_id)
    assert state["next"] == ["approve"]
    (request,) = [i["value"] for i in state["interrupts"]]
    assert [c["tool_name"] for c in request["calls"]] == ["restart_service"]
    assert paused["run"]["receipts"] == []  # nothing ran before the approval

    out = client.runs.wait(thread_id, assistant, command={"resume": "approve"}, context=CONTEXT)
    assert out["run"]["termination"] == "completed"
    restarts = [r for r in out["run"]["receipts"] if r["tool_name"] == "restart_service"]
    assert [(r["status"], r.get("attempts", 1)) for r in restarts] == [("completed", 1)]
    assert client.threads.get_state(thread_id)["next"] == []


def test_the_docs_server_block_runs_as_shown(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    [block] = re.findall(r'```python title="sdk"\n(.*?)```', readme, flags=re.S)
    assert 'url="http://127.0.0.1:2024"' in block
    source = block.replace('url="http://127.0.0.1:2024"', f'url="{server}"')
    exec(compile(source, "docs/server.md (python sdk)", "exec"), {"__name__": "docs_sdk"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "completed ['call-0001', 'call-0002']"
    assert printed[-2:] == ["restart_service", "completed ['completed']"]
    assert printed[1:-2] == ["validate approval_pending"]


def _streamed_messages(parts: list[Any]) -> list[dict[str, Any]]:
    """The messages a chat UI gets from ``messages-tuple`` events: ``[message, metadata]``."""
    return [p.data[0] for p in parts if p.event == "messages"]


def _internal_calls(message: dict[str, Any]) -> set[str]:
    calls = (message.get("tool_calls") or []) + (message.get("tool_call_chunks") or [])
    return {str(c.get("name")) for c in calls} & {"final_answer", "abstain"}


@pytest.mark.parametrize(
    "given",
    [
        {"messages": [{"role": "user", "content": "Why is checkout returning 500s?"}]},
        {"request": {"question": "Why is checkout returning 500s?"}},
    ],
)
def test_agent_chat_ui_gets_each_model_turn_once_with_the_ids_the_thread_keeps(
    client: Any, given: dict[str, Any]
) -> None:
    thread_id = client.threads.create()["thread_id"]
    parts = list(
        client.runs.stream(
            thread_id,
            CHAT_GRAPH,
            input=given,
            context=CONTEXT,
            stream_mode=["messages-tuple", "values"],
        )
    )
    streamed = _streamed_messages(parts)
    stored = _values(client, thread_id)["messages"]
    assert _values(client, thread_id)["run"]["termination"] == "completed"
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"]
    ids = [m["id"] for m in streamed]
    assert ids == list(dict.fromkeys(ids)), f"a message streamed twice: {ids}"
    stored_ids = [m["id"] for m in stored]
    assert ids == [i for i in stored_ids if i in ids], "streamed out of the thread's order"
    assert [m["id"] for m in streamed if m["type"] != "human"] == stored_ids[1:]
    assert all(m["type"] != "human" for m in streamed[1:]), "the question comes first"
    assert not any(_internal_calls(m) for m in streamed)
    assert streamed[-1]["content"] == stored[-1]["content"]


def test_a_conversation_through_the_sdk_is_one_run_per_message(client: Any) -> None:
    thread_id = client.threads.create()["thread_id"]
    first = client.runs.wait(
        thread_id,
        CHAT_GRAPH,
        input={"messages": [{"role": "user", "content": "Why is checkout failing?"}]},
        context=CONTEXT,
    )
    parts = list(
        client.runs.stream(
            thread_id,
            CHAT_GRAPH,
            input={"messages": [{"role": "user", "content": "And since when?"}]},
            context=CONTEXT,
            stream_mode=["messages-tuple", "values"],
        )
    )
    values = _values(client, thread_id)
    second = values["run"]
    assert first["run"]["termination"] == second["termination"] == "completed"
    assert second["run_id"] != first["run"]["run_id"]
    assert second["question"] == "And since when?"
    assert [t["run_id"] for t in second["turns"]] == [first["run"]["run_id"]]
    stored = values["messages"]
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"] * 2
    streamed = _streamed_messages(parts)
    ids = [m["id"] for m in streamed]
    assert ids == list(dict.fromkeys(ids)), f"a message streamed twice: {ids}"
    assert [m["id"] for m in streamed if m["type"] != "human"] == [m["id"] for m in stored[5:]]
