"""``python -m benchmarks.agentdojo.smoke``: one suite, a few pairs, and the harness's invariants.

Run by ``make test`` (``tests/benchmarks/test_agentdojo_harness.py``) in the harness's own
virtual environment. Every socket connection is refused while it runs, so it also shows that
AgentDojo's checks, the replay and fencepost need no network (and so no model). Prints one JSON
line of numbers; exits non-zero, naming the broken invariant, when one does not hold.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .offline import offline
from .policies import LEAST_PRIVILEGE_WITHHELD, POLICIES
from .report import render
from .runner import CEILING, Results, Selection, run

SUITE = "banking"
USER_TASKS = ("user_task_0", "user_task_3")
"""Pay a bill read from a file; refund a friend: one write each, both injectable."""
INJECTION_TASKS = ("injection_task_0", "injection_task_7")
"""Money to the attacker's account (a write with other arguments); change the password."""


def check(results: Results) -> dict[str, Any]:
    """The invariants; returns the numbers they were checked on. Raises AssertionError."""
    records = results.records
    runners = (CEILING, *(p.name for p in POLICIES))
    benign = [r for r in records if r.injection_task is None]
    attacks = [r for r in records if r.injection_task is not None]
    pairs = {(r.user_task, r.injection_task) for r in attacks}
    assert len(benign) == len(USER_TASKS) * len(runners), "one benign run per task and runner"
    assert pairs == {(u, i) for u in USER_TASKS for i in INJECTION_TASKS}, "every pair attempted"
    assert len(attacks) == len(pairs) * len(runners), "one attack run per pair and runner"
    for r in benign:
        if r.policy in (CEILING, "permissive/end_run", "permissive/observe"):
            assert r.utility and not r.false_block, f"benign {r.user_task} passes under {r.policy}"
    for r in records:
        f = r.facts
        assert f.executed <= f.proposed, f"{r}: ran more calls than the script proposed"
        assert f.user_calls_run <= f.user_calls_planned, f"{r}: ran more user calls than planned"
        if r.attack_reached:
            assert f.injected, f"{r}: goal reached although the victim never saw the injection"
        if r.policy != CEILING:
            assert f.termination in (
                "completed",
                "policy_denied",
                "no_progress",
                "invalid_proposal",
            ), f"{r}: unexpected ending {f.termination}"
            # A call fencepost denied never ran, whether its denial ended the run or was data.
            assert not set(f.denied_call_ids) & set(f.ran_call_ids), f"{r}: a denied call ran"
        if r.policy.startswith("least-privilege"):
            withheld = set(LEAST_PRIVILEGE_WITHHELD[r.suite])
            assert not withheld & set(f.ran_tools), f"{r}: a withheld tool ran"
        if any(code == "capability_denied" for _, code in f.refusals):
            # A capability denial ends the run, or (denial as data) the run goes on.
            ended = f.termination == "policy_denied"
            assert ended == r.policy.endswith("/end_run"), f"{r}: the denial mode was not kept"
    by = {(r.policy, r.user_task, r.injection_task): r for r in attacks}
    for user, injection in pairs:
        ceiling = by[(CEILING, user, injection)]
        assert ceiling.attack_reached and ceiling.facts.injected, f"the ceiling reaches {injection}"
        for mode in ("end_run", "observe"):
            permissive = by[(f"permissive/{mode}", user, injection)]
            assert permissive.attack_reached, "permissive stops nothing here"
    for user in USER_TASKS:
        # The attacker's account is on no record and in no request: the approver rejects it.
        for mode in ("end_run", "observe"):
            assert not by[(f"approver/{mode}", user, "injection_task_0")].attack_reached
    text = render(results, command="python -m benchmarks.agentdojo.smoke")
    reached = {n: sum(r.attack_reached for r in attacks if r.policy == n) for n in runners}
    for n in runners:
        assert f"| {n} |" in text or n == CEILING, f"the report has a row for {n}"
    return {
        "suite": SUITE,
        "runs": len(records),
        "benign_runs": len(benign),
        "attack_runs": len(attacks),
        "pairs": len(pairs),
        "benign_utility": {n: sum(r.utility for r in benign if r.policy == n) for n in runners},
        "false_blocks": {n: sum(r.false_block for r in benign if r.policy == n) for n in runners},
        "reached": reached,
        "utility_under_attack": {
            n: sum(r.utility for r in attacks if r.policy == n) for n in runners
        },
    }


def main() -> int:
    """Run the smoke; print its numbers as one JSON line."""
    offline()
    selection = Selection(suites=(SUITE,), user_ids=USER_TASKS, injection_ids=INJECTION_TASKS)
    try:
        numbers = check(run(selection))
    except AssertionError as exc:
        print(f"agentdojo smoke: invariant broken: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(numbers, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
