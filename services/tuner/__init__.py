"""Tuner: the strategy space (arms), the bucketed bandit over it, and length-aware draft budgets.

Plain Python (no Ray, no engine import); a Ray actor wrapper, if any, stays a thin layer over these classes.
"""

from services.tuner.arms import OFF, Arm, Drafter, TunerConfigError, default_arms, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
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
    "TablePolicy",
    "TunerConfigError",
    "default_arms",
    "parse_arms",
]
