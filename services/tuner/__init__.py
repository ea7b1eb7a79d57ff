"""Tuner: the strategy space (arms), the central bucketed bandit, the rollout actor's strategy selector and
length-aware draft budgets.

Plain Python (no Ray); the Ray actor and gRPC faces stay thin layers over these classes. The selector
(``services.tuner.selector``) is imported from its module: it needs the engine's types (and torch).
"""

from services.tuner.arms import OFF, Arm, Drafter, TunerConfigError, default_arms, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, gate_table, share_allowance
from services.tuner.budgets import BudgetConfig, LengthBudgets, LengthHistory

__all__ = [
    "OFF",
    "Arm",
    "BanditConfig",
    "BucketedBandit",
    "BudgetConfig",
    "Drafter",
    "LengthBudgets",
    "LengthHistory",
    "TunerConfigError",
    "default_arms",
    "gate_table",
    "parse_arms",
    "share_allowance",
]
