"""The rollout actor's in-process strategy policy: the tuner's table + length-aware budgets, no RPC per step.

``TunedStrategyPolicy`` implements the engine's ``StrategyPolicy``: per decode step it asks its
``TablePolicy`` (a copy of the central tuner's strategy table) for the arm of the current active batch size,
then gives each request a draft budget from ``LengthBudgets`` (long requests first, per-step quota; after
DAS). After the step it records the arm's reward (committed tokens / seconds) for the central tuner, which
drains the records in batches (``drain_observations``) and sends back a newer table (``update_table``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, StepObservation, Strategy
from services.tuner.bandit import TablePolicy
from services.tuner.budgets import BudgetConfig, LengthBudgets


class TunedStrategyPolicy:
    """Engine ``StrategyPolicy`` driven by a tuner table.

    Args:
        table: ``BucketedBandit.table()`` of the central tuner.
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: exploration RNG seed (one per actor so actors explore differently).
    """

    def __init__(self, table: Mapping[str, Any], budgets: BudgetConfig | None = None, seed: int = 0):
        self.table = TablePolicy(table, seed=seed)
        self.budgets = LengthBudgets(budgets or BudgetConfig())
        self._arm = None
        self.choices: dict[str, int] = {}  # arm name -> steps it was chosen (this actor, since last drain)

    def update_table(self, table: Mapping[str, Any]) -> None:
        self.table.update(table)

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses (problem_id, generated tokens): the per-problem length history."""
        self.budgets.history.record_many(items)

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
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
        if self._arm is not None:
            self.table.observe(obs.batch_size, self._arm, obs.committed_tokens, obs.seconds)

    def drain_observations(self) -> list[dict]:
        return self.table.drain_observations()
