"""Gating the learned drafter's arms out of the strategy table until the spot trainer has a useful head
(``bandit.gate_table``, ``ControlPlane.gated_drafters``, ``tuner.learned_min_top1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, load_config
from services.pipeline.control_plane import ControlPlane
from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import StepObservation
from services.tuner.arms import OFF, Arm, Drafter
from services.tuner.bandit import BanditConfig, BucketedBandit, gate_table
from services.tuner.selector import StrategySelector

LEARNED = Arm(Drafter.LEARNED, 4)
HYBRID = Arm(Drafter.HYBRID, 8)
SUFFIX = Arm(Drafter.SUFFIX, 8)


def _bandit() -> BucketedBandit:
    b = BucketedBandit([OFF, SUFFIX, LEARNED, HYBRID], BanditConfig(min_samples=4))
    for i in range(8):  # at batch 1 the learned arm is the best, then hybrid, suffix, off
        jitter = 0.0001 * (i % 3)
        b.observe(1, OFF, 1, 0.010 + jitter)
        b.observe(1, SUFFIX, 1.3, 0.010 + jitter)
        b.observe(1, LEARNED, 2.0, 0.010 + jitter)
        b.observe(1, HYBRID, 1.5, 0.010 + jitter)
    return b


def test_gated_arms_are_never_played_and_best_falls_back_to_off():
    bandit = _bandit()
    table = bandit.table()
    assert table["buckets"][0]["best"] == LEARNED.name
    gated = gate_table(table, ["learned", "hybrid"])
    b0 = gated["buckets"][0]
    assert b0["best"] == OFF.name  # the gate does not promote another arm: off is the safe choice
    assert b0["explore"] == [SUFFIX.name] and not b0["probe"]
    assert b0["gated"] == sorted([LEARNED.name, HYBRID.name])
    assert table["buckets"][0]["best"] == LEARNED.name  # the original table is not modified
    sel = StrategySelector({**gated, "regret_budget": 1.0}, clock="engine")
    played = set()
    for _ in range(50):
        s = sel.choose([DraftRequest("r", "p", [1, 2], 1)])[0]
        played.add(s.drafter)
        sel.observe(StepObservation(1, s.name, 1, 0, 0, 0.01))
    assert played == {"off", "suffix"}
    hyb = gate_table(table, ["hybrid"])["buckets"][0]  # gating an arm that is not the best keeps the best
    assert hyb["best"] == LEARNED.name and HYBRID.name not in hyb["explore"] and len(hyb["explore"]) == 2
    # the gate does not touch the statistics: without it, the table is the bandit's again
    assert gate_table(bandit.table(), [])["buckets"][0]["best"] == LEARNED.name


def _plane(top1_bar: float, drafters=("suffix", "ngram", "learned", "hybrid")) -> ControlPlane:
    cfg = load_config(None, [f"tuner.learned_min_top1={top1_bar}"])
    return ControlPlane(cfg, Path("."), Path("."), None, list(drafters), run_info=dict)


def test_control_plane_gates_until_the_head_is_good_enough():
    plane = _plane(0.5)
    assert plane.gated_drafters() == ["learned", "hybrid"]  # not trained yet
    plane.learned_top1 = 0.31
    assert plane.gated_drafters() == ["learned", "hybrid"]
    plane.learned_top1 = 0.52
    assert plane.gated_drafters() == []
    assert _plane(0.0).gated_drafters() == []  # 0: always in
    assert _plane(0.5, ("suffix", "ngram")).gated_drafters() == []  # no learned drafter: nothing to gate


def test_control_plane_gives_each_rollout_actor_its_share_of_the_regret_allowance():
    bandit = _bandit()
    cfg = load_config(None, ["rollout.num_actors=3"])
    plane = ControlPlane(cfg, Path("."), Path("."), None, ["suffix"], run_info=dict)

    class Tuner:  # the tuner actor's client: its merged table
        def table(self):
            return bandit.table()

    plane.tuner_client = Tuner()
    full = bandit.table()["buckets"][0]["allowance"]
    assert full > 0 and plane.strategy_table()["buckets"][0]["allowance"] == pytest.approx(full / 3)


def test_bad_threshold_is_a_config_error():
    with pytest.raises(ConfigError, match="tuner.learned_min_top1"):
        load_config(None, ["tuner.learned_min_top1=1.5"])
