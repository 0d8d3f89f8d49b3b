"""``python -m benchmarks.agentdojo``: every suite under every policy, into the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import suites
from .offline import offline
from .policies import POLICIES, named
from .report import render
from .runner import Selection, run


def main(argv: list[str] | None = None) -> int:
    """Run the selection and write the report; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agentdojo", description=__doc__)
    parser.add_argument(
        "--suite", action="append", choices=suites.SUITE_NAMES, help="a suite (default: all four)"
    )
    parser.add_argument(
        "--user-task", action="append", help="only this user task (user_task_3; repeatable)"
    )
    parser.add_argument(
        "--injection-task",
        action="append",
        help="only this injection task (injection_task_0; repeatable; 'none': benign runs only)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        help="only this policy (approver/observe) or base policy (approver: both denial modes)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/agentdojo.md"))
    args = parser.parse_args(argv)
    offline()
    injections = args.injection_task
    selection = Selection(
        suites=tuple(args.suite or suites.SUITE_NAMES),
        user_ids=tuple(args.user_task) if args.user_task else None,
        injection_ids=() if injections == ["none"] else tuple(injections) if injections else None,
        policies=named(args.policy) if args.policy else POLICIES,
    )
    subset = bool(args.user_task or args.injection_task or args.policy)
    results = run(selection, progress=lambda line: print(line, file=sys.stderr, flush=True))
    command = (
        "make agentdojo"
        if args.suite is None and not subset
        else "python -m benchmarks.agentdojo "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    args.out.write_text(render(results, command=command))
    print(
        f"wrote {args.out} ({len(results.records)} runs, {results.seconds:.0f} s)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
