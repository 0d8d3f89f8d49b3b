"""The AgentDojo harness (benchmarks/agentdojo) cannot rot: its smoke runs in make test.

The harness needs agentdojo, which lives in a virtual environment of its own
(benchmarks/agentdojo/.venv, built by ``make test`` and ``make agentdojo``), so the smoke runs
there as a subprocess. A missing environment fails this test: it is never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS_PYTHON = ROOT / "benchmarks" / "agentdojo" / ".venv" / "bin" / "python"
BASES = ("permissive", "least-privilege", "approver", "least-privilege+approver")
RUNNERS = ("ceiling", *(f"{b}/{m}" for b in BASES for m in ("end_run", "observe")))


def _smoke() -> dict[str, object]:
    assert HARNESS_PYTHON.exists(), (
        f"{HARNESS_PYTHON} is missing: build the harness environment with "
        "`make benchmarks/agentdojo/.venv/.installed` (make test does)"
    )
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(HARNESS_PYTHON), "-m", "benchmarks.agentdojo.smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    numbers: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return numbers


def test_the_agentdojo_smoke_scores_benign_tasks_and_attack_pairs_offline_by_agentdojo() -> None:
    numbers = _smoke()
    pairs = numbers["pairs"]
    assert numbers["suite"] == "banking" and pairs == 4
    assert numbers["benign_runs"] == 2 * len(RUNNERS)
    assert numbers["attack_runs"] == pairs * len(RUNNERS)
    benign_utility = numbers["benign_utility"]
    false_blocks = numbers["false_blocks"]
    reached = numbers["reached"]
    utility = numbers["utility_under_attack"]
    assert isinstance(benign_utility, dict) and isinstance(false_blocks, dict)
    assert isinstance(reached, dict) and isinstance(utility, dict)
    for mode in ("end_run", "observe"):
        # A benign task passes through fencepost as it does without it.
        assert benign_utility["ceiling"] == benign_utility[f"permissive/{mode}"] == 2
        assert false_blocks[f"permissive/{mode}"] == 0
        # The attack pairs are scored: the bare replay and the permissive policy reach every
        # goal.
        assert reached["ceiling"] == reached[f"permissive/{mode}"] == pairs
        # The approver's payee rule stops the transfers to the attacker (injection_task_0).
        assert reached[f"approver/{mode}"] <= pairs - 2
    # No policy reaches more than the ceiling.
    for name in RUNNERS:
        assert 0 <= reached[name] <= reached["ceiling"]
        assert 0 <= utility[name] <= pairs
