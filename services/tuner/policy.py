"""The rollout actor's in-process strategy policy: the tuner's table + length-aware budgets, no RPC per step.

``TunedStrategyPolicy`` implements the engine's ``StrategyPolicy``: per decode step it asks its
``TablePolicy`` (a copy of the central tuner's strategy table) for the arm of the current active batch size,
then gives each request a draft budget from ``LengthBudgets`` (long requests first, per-step quota; after
DAS). After the step it records the arm's reward (committed tokens / seconds) for the central tuner, which
drains the records in batches (``drain_observations``) and sends back a newer table (``update_table``).

Which seconds (``clock``):

- ``"thread"``: the decoding thread's CPU time from ``choose`` to ``observe`` (``time.thread_time``: draft +
  verify + commit, the span of the engine's step). When the model runs on the CPU, that is the step's cost
  without the time the thread waited for a core: on an oversubscribed machine (other processes, other
  actors) wall time adds noise that has nothing to do with the arm, and the bandit then mistakes a busy
  neighbour for a slow arm.
- ``"engine"``: the wall time the engine measured (``StepObservation.seconds``). Needed when the model runs on
  an accelerator (the CPU thread only launches kernels and waits), and when a caller substitutes modeled
  step times (tests).
- ``"auto"`` (default): ``"thread"`` when torch sees no CUDA device, else ``"engine"``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, StepObservation, Strategy
from services.tuner.arms import TunerConfigError
from services.tuner.bandit import TablePolicy
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")


def resolve_clock(clock: str) -> str:
    """``"thread"`` or ``"engine"`` for a ``clock`` setting (``"auto"``: thread CPU time without CUDA)."""
    if clock not in CLOCKS:
        raise TunerConfigError(f"TunedStrategyPolicy: clock must be one of {CLOCKS}, got {clock!r}")
    if clock != "auto":
        return clock
    try:
        import torch

        return "engine" if torch.cuda.is_available() else "thread"
    except ImportError:  # no torch: no accelerator either
        return "thread"


class TunedStrategyPolicy:
    """Engine ``StrategyPolicy`` driven by a tuner table.

    Args:
        table: ``BucketedBandit.table()`` of the central tuner.
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: exploration RNG seed (one per actor so actors explore differently).
        clock: how a step's seconds are measured: ``"auto"``, ``"thread"`` or ``"engine"`` (module docstring).
    """

    def __init__(
        self,
        table: Mapping[str, Any],
        budgets: BudgetConfig | None = None,
        seed: int = 0,
        clock: str = "auto",
    ):
        self.table = TablePolicy(table, seed=seed)
        self.budgets = LengthBudgets(budgets or BudgetConfig())
        self.clock = resolve_clock(clock)
        self._t0: float | None = None
        self._arm = None
        self.choices: dict[str, int] = {}  # arm name -> steps it was chosen (this actor, since last drain)

    def update_table(self, table: Mapping[str, Any]) -> None:
        self.table.update(table)

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses (problem_id, generated tokens): the per-problem length history."""
        self.budgets.history.record_many(items)

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        if self.clock == "thread":
            self._t0 = time.thread_time()
        arm = self.table.choose(len(requests))
        self._arm = arm
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        if arm.is_off:
            return [OFF] * len(requests)
        alloc = self.budgets.allocate(
            [
                (r.request_id, r.problem_id, arm.max_draft_tokens, len(r.token_ids) - r.num_prompt_tokens)
                for r in requests
            ]
        )
        return [
            Strategy(str(arm.drafter), alloc[r.request_id], arm.tree_width, arm.tree_depth) for r in requests
        ]

    def observe(self, obs: StepObservation) -> None:
        if self._arm is None:
            return
        seconds = obs.seconds
        if self._t0 is not None:
            cpu = time.thread_time() - self._t0
            self._t0 = None
            if cpu > 0:  # a clock too coarse to see the step falls back to the engine's wall time
                seconds = cpu
        self.table.observe(obs.batch_size, self._arm, obs.committed_tokens, seconds)

    def drain_observations(self) -> list[dict]:
        return self.table.drain_observations()

    def drain_demotions(self) -> int:
        """Buckets whose drafting best this actor demoted to off since the last call (``TablePolicy``)."""
        n, self.table.demotions = sum(self.table.demotions.values()), {}
        return n
