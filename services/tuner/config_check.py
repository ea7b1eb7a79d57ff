"""The run config's ``tuner`` section, checked with the tuner's own parsers (``tailspec train`` fails before
any actor starts).

``check_tuner_section(section)`` takes ``Config.tuner`` (``services/common/config.py``'s ``TunerSection``) and
raises ``TunerConfigError`` (the message names the key) when ``arms`` do not parse, ``bandit`` or ``budgets``
hold an unknown key or a bad value, or, with the tuner enabled, ``init_state`` is not a tuner checkpoint that
fits these arms and bucket edges. It changes nothing.
"""

from __future__ import annotations

from typing import Any

from services.tuner.arms import TunerConfigError, default_arms, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit
from services.tuner.budgets import BudgetConfig
from services.tuner.service import load_state_file


def check_tuner_section(section: Any) -> None:
    """Raise ``TunerConfigError`` for a ``tuner`` section the tuner could not run (see the module)."""
    if section.arms is not None:
        parse_arms(section.arms, "tuner.arms")
    bandit_cfg = BanditConfig.from_dict(section.bandit)
    BudgetConfig.from_dict(section.budgets)
    if section.enabled and section.init_state is not None:
        arms = parse_arms(section.arms, "tuner.arms") if section.arms is not None else default_arms()
        load_state_file(BucketedBandit(arms, bandit_cfg), section.init_state)  # fails before any start


__all__ = ["TunerConfigError", "check_tuner_section"]
