"""``python -m benchmarks.agentdojo``: every suite under every policy, into the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import suites
from .offline import offline
from .report import render
from .runner import Selection, run


def main(argv: list[str] | None = None) -> int:
    """Run the selection and write the report; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agentdojo", description=__doc__)
    parser.add_argument(
        "--suite", action="append", choices=suites.SUITE_NAMES, help="a suite (default: all four)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/agentdojo.md"))
    args = parser.parse_args(argv)
    offline()
    selection = Selection(suites=tuple(args.suite or suites.SUITE_NAMES))
    results = run(selection, progress=lambda line: print(line, file=sys.stderr, flush=True))
    command = (
        "make agentdojo"
        if args.suite is None
        else "python -m benchmarks.agentdojo " + " ".join(f"--suite {s}" for s in selection.suites)
    )
    args.out.write_text(render(results, command=command))
    print(
        f"wrote {args.out} ({len(results.records)} runs, {results.seconds:.0f} s)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
