"""Over an event loop, a batch's rules run on one fencepost thread, in line with the judgement
(one hop a batch, not a hop to leave the loop and one more a rule); one that blocks still leaves
that thread behind at its limit, and the batch is judged again with each rule that answered
given its answer, never called twice, the blocked one timed out and any later one run."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import fencepost as fp
import fencepost.graph.rules
from fencepost.graph.node_io import AsyncIO
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.policy.deadline import SystemClock
from fencepost.policy.rule_runner import RuleTimedOut
from tests.policy.factories import make_spec

FOREVER = 60.0


def _registry() -> fp.ToolRegistry:
    return fp.ToolRegistry([make_spec(semantic_validator=lambda args, state: None)])


def _ctx() -> fp.RunContext:
    return fp.RunContext(tenant_id="t", principal=fp.Principal(id="u", capabilities=set()))


class Rule:
    """A rule that answers ``answer`` (or blocks until released), counting its calls and
    noting the thread it ran on."""

    def __init__(self, answer: Any = None, *, blocks: bool = False) -> None:
        self.answer = answer
        self.blocks = blocks
        self.calls = 0
        self.threads: list[int] = []
        self.release = threading.Event()

    def __call__(self) -> Any:
        self.calls += 1
        self.threads.append(threading.get_ident())
        if self.blocks:
            self.release.wait(FOREVER)
        return self.answer


def _judge(rules: list[Rule], runner: ContainedRules, judged_on: list[int]) -> Any:
    def judge() -> list[Any]:
        judged_on.append(threading.get_ident())
        out: list[Any] = []
        for rule in rules:
            try:
                out.append(runner(rule))
            except RuleTimedOut:
                out.append("timed out")
        return out

    return judge


def _judged(rules: list[Rule], judged_on: list[int] | None = None) -> tuple[list[Any], int]:
    judged_on = [] if judged_on is None else judged_on
    runner = ContainedRules(_ctx(), SystemClock())
    io = AsyncIO(SimpleNamespace(ledger=None))  # type: ignore[arg-type]

    async def main() -> tuple[list[Any], int]:
        loop_thread = threading.get_ident()
        names = ["search_logs"]
        out = await judged_with_rules(
            io, _registry(), names, _judge(rules, runner, judged_on), runner
        )
        return out, loop_thread

    return asyncio.run(main())


def test_a_batchs_rules_run_on_one_thread_off_the_loop() -> None:
    rules = [Rule("a"), Rule("b"), Rule("c")]
    judged_on: list[int] = []
    out, loop_thread = _judged(rules, judged_on)
    assert out == ["a", "b", "c"]
    threads = {t for rule in rules for t in rule.threads}
    # The rules ran where the batch was judged: no hop a rule, and not on the loop.
    assert threads == set(judged_on) and loop_thread not in threads
    assert [rule.calls for rule in rules] == [1, 1, 1]


def test_a_rule_that_blocks_is_left_behind_and_no_answered_rule_runs_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fencepost.graph.rules, "RULE_TIMEOUT_SECONDS", 1.0)
    blocked = Rule("late", blocks=True)
    rules = [Rule("a"), blocked, Rule("c")]
    try:
        out, _ = _judged(rules)
        assert out == ["a", "timed out", "c"]
        assert blocked.calls == 1 and not blocked.release.is_set()
        assert [rules[0].calls, rules[2].calls] == [1, 1]
    finally:
        blocked.release.set()


def test_a_rule_that_raised_raises_the_same_when_the_batch_is_judged_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fencepost.graph.rules, "RULE_TIMEOUT_SECONDS", 1.0)
    failure = ValueError("the rule broke")

    def broken() -> None:
        raise failure

    blocked = Rule(blocks=True)
    runner = ContainedRules(_ctx(), SystemClock())
    io = AsyncIO(SimpleNamespace(ledger=None))  # type: ignore[arg-type]

    def judge() -> list[Any]:
        out: list[Any] = []
        for rule in (broken, blocked):
            try:
                out.append(runner(rule))
            except RuleTimedOut:
                out.append("timed out")
            except ValueError as exc:
                out.append(exc)
        return out

    try:
        out = asyncio.run(judged_with_rules(io, _registry(), ["search_logs"], judge, runner))
        assert out == [failure, "timed out"]
        assert blocked.calls == 1
    finally:
        blocked.release.set()
