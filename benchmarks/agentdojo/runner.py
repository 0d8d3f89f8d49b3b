"""Every suite under every policy: the benign runs, the attack pairs, and the ceiling."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import TaskEnvironment

from . import suites
from .pipeline import CeilingPipeline, FencepostPipeline, RunFacts
from .policies import POLICIES, SHIPPED, Policy

CEILING = "ceiling"
"""The name the bare replay's records carry in place of a policy's."""


@dataclass(frozen=True)
class Record:
    """One scored run."""

    suite: str
    user_task: str
    injection_task: str | None
    """``None`` for a benign run."""
    policy: str
    utility: bool
    """AgentDojo's utility check of the user task."""
    attack_reached: bool
    """AgentDojo's security check of the injection task: True when the attacker's goal was
    reached (always False for a benign run)."""
    facts: RunFacts
    attack: str = suites.DEFAULT_ATTACK
    """The AgentDojo attack template that wrote the injection (benign runs: the default)."""
    held_out: bool = False
    """Whether the injection task is one of the held-out ones (:mod:`.held_out`)."""

    @property
    def false_block(self) -> bool:
        """A benign run in which the policy refused a call or ended the run before the user
        task's calls had all run."""
        return self.injection_task is None and (
            bool(self.facts.refusals)
            or self.facts.termination not in ("completed", "replayed")
            or self.facts.user_calls_run < self.facts.user_calls_planned
        )


def run_one(
    suite_name: str,
    user_task: BaseUserTask[Any],
    injection_task: BaseInjectionTask[Any] | None,
    policy: Policy | None,
    environment: TaskEnvironment | None = None,
    *,
    attack: str = suites.DEFAULT_ATTACK,
    held_out: bool = False,
) -> Record:
    """One run, scored by AgentDojo (``policy=None``: the ceiling, straight on its runtime).

    ``environment``: the injected environment AgentDojo would load for this pair, loaded once
    for all its runs (a copy is run); by default AgentDojo loads it."""
    suite = suites.suite(suite_name)
    injections = (
        suites.injections(suite_name, user_task, injection_task, attack)
        if injection_task is not None
        else {}
    )
    pipeline: FencepostPipeline | CeilingPipeline = (
        CeilingPipeline(suite_name, user_task, injection_task)
        if policy is None
        else FencepostPipeline(suite_name, user_task, injection_task, policy)
    )
    with warnings.catch_warnings():
        # AgentDojo warns on each model output of None; the pipelines never return one.
        warnings.simplefilter("error", UserWarning)
        utility, security = suite.run_task_with_pipeline(
            pipeline,
            user_task,
            injection_task,
            injections,
            environment=environment.model_copy(deep=True) if environment is not None else None,
        )
    return Record(
        suite=suite_name,
        user_task=user_task.ID,
        injection_task=injection_task.ID if injection_task is not None else None,
        policy=CEILING if policy is None else policy.name,
        utility=bool(utility),
        attack_reached=bool(security) if injection_task is not None else False,
        facts=pipeline.facts,
        attack=attack,
        held_out=held_out,
    )


_ATTACKS = suites.ATTACKS  # the Selection's field `suites` shadows the module in its body


@dataclass(frozen=True)
class Selection:
    """Which runs to make: suites, and optionally a subset of tasks (the smoke test's)."""

    suites: tuple[str, ...] = suites.SUITE_NAMES
    user_ids: tuple[str, ...] | None = None
    injection_ids: tuple[str, ...] | None = None
    policies: tuple[Policy, ...] = POLICIES
    held_out: bool = True
    """Also the held-out injection tasks (:mod:`.held_out`)."""
    attacks: tuple[str, ...] = _ATTACKS
    """The attack templates: the default one over every pair and policy, each other one over
    the first :attr:`template_users` user tasks of each suite, bare and under the shipped
    policy only."""
    template_users: int = 3


@dataclass(frozen=True)
class Results:
    """All records of a selection, and what was left out as not replayable."""

    records: tuple[Record, ...]
    not_replayable: tuple[str, ...]
    """Keys of the attack pairs no replay can attempt (see :func:`.suites.replayable`)."""
    seconds: float


def _environment(
    suite_name: str,
    user_task: BaseUserTask[Any] | None,
    injection_task: BaseInjectionTask[Any] | None,
    attack: str = suites.DEFAULT_ATTACK,
) -> TaskEnvironment:
    """What AgentDojo's ``run_task_with_pipeline`` loads for the pair: the suite's environment
    with the attack injected (none for a benign run)."""
    injections = (
        suites.injections(suite_name, user_task, injection_task, attack)
        if user_task is not None and injection_task is not None
        else {}
    )
    return suites.suite(suite_name).load_and_inject_default_environment(injections)


def run(selection: Selection, progress: Callable[[str], None] | None = None) -> Results:
    """Run the selection: per suite, the benign runs and every replayable attack pair, each
    under the ceiling and every policy."""
    started = time.perf_counter()
    records: list[Record] = []
    skipped: list[str] = []
    runners: Sequence[Policy | None] = (None, *selection.policies)
    for suite_name in selection.suites:
        for user_task in suites.user_tasks(suite_name):
            if selection.user_ids is not None and user_task.ID not in selection.user_ids:
                continue
            environment = _environment(suite_name, None, None)
            for policy in runners:
                records.append(run_one(suite_name, user_task, None, policy, environment))
        template_users = {u.ID for u in suites.user_tasks(suite_name)[: selection.template_users]}
        for attack in selection.attacks:
            main = attack == suites.DEFAULT_ATTACK
            here: Sequence[Policy | None] = (
                runners if main else (None, *(p for p in selection.policies if p.name == SHIPPED))
            )
            for held_out in (False, True) if selection.held_out else (False,):
                for pair in suites.pairs(
                    suite_name,
                    user_ids=selection.user_ids,
                    injection_ids=selection.injection_ids,
                    held_out=held_out,
                ):
                    if not main and pair.user_task.ID not in template_users:
                        continue
                    if not pair.replayable:
                        if main:
                            skipped.append(pair.key)
                        continue
                    if not suites.template_applies(suite_name, attack, pair.injection_task):
                        continue
                    environment = _environment(
                        suite_name, pair.user_task, pair.injection_task, attack
                    )
                    for policy in here:
                        records.append(
                            run_one(
                                suite_name,
                                pair.user_task,
                                pair.injection_task,
                                policy,
                                environment,
                                attack=attack,
                                held_out=held_out,
                            )
                        )
        if progress is not None:
            progress(
                f"{suite_name}: {len(records)} runs so far, {time.perf_counter() - started:.0f} s"
            )
    return Results(tuple(records), tuple(skipped), time.perf_counter() - started)


def select(records: Iterable[Record], **where: Any) -> list[Record]:
    """The records whose fields equal ``where`` (``injection_task=...`` matches ``None`` too)."""
    return [r for r in records if all(getattr(r, k) == v for k, v in where.items())]
