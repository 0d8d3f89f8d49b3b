"""``python -m benchmarks.agentdojo``: every suite under every policy, into the report."""

from __future__ import annotations

import argparse
import pickle
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
    parser.add_argument(
        "--attack",
        action="append",
        choices=suites.ATTACKS,
        help=f"only this attack template (default: all; {suites.DEFAULT_ATTACK} over every pair)",
    )
    parser.add_argument(
        "--no-held-out", action="store_true", help="AgentDojo's injection tasks only"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/agentdojo.md"))
    parser.add_argument(
        "--records", type=Path, help="also keep the run's records here (a pickle), to render again"
    )
    parser.add_argument(
        "--render", type=Path, help="render the report from kept records instead of running"
    )
    args = parser.parse_args(argv)
    offline()
    if args.render is not None:
        kept = pickle.loads(args.render.read_bytes())
        args.out.write_text(render(kept["results"], command=kept["command"]))
        print(f"wrote {args.out} from {args.render}", file=sys.stderr)
        return 0
    injections = args.injection_task
    selection = Selection(
        suites=tuple(args.suite or suites.SUITE_NAMES),
        user_ids=tuple(args.user_task) if args.user_task else None,
        injection_ids=() if injections == ["none"] else tuple(injections) if injections else None,
        policies=named(args.policy) if args.policy else POLICIES,
        held_out=not args.no_held_out,
        attacks=tuple(args.attack) if args.attack else suites.ATTACKS,
    )
    subset = bool(
        args.user_task or args.injection_task or args.policy or args.attack or args.no_held_out
    )
    results = run(selection, progress=lambda line: print(line, file=sys.stderr, flush=True))
    command = (
        "make agentdojo"
        if args.suite is None and not subset
        else "python -m benchmarks.agentdojo "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    if args.records is not None:
        args.records.write_bytes(pickle.dumps({"results": results, "command": command}))
    args.out.write_text(render(results, command=command))
    print(
        f"wrote {args.out} ({len(results.records)} runs, {results.seconds:.0f} s)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
