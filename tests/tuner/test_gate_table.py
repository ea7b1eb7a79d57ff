"""Gating the learned drafter's arms out of the strategy table until the spot trainer has a useful head
(``bandit.gate_table``, ``ControlPlane.gated_drafters``, ``tuner.learned_min_top1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, load_config
from services.pipeline.control_plane import ControlPlane
from services.tuner.arms import OFF, Arm, Drafter
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy, gate_table

LEARNED = Arm(Drafter.LEARNED, 4)
HYBRID = Arm(Drafter.HYBRID, 8)
SUFFIX = Arm(Drafter.SUFFIX, 8)


def _bandit() -> BucketedBandit:
    b = BucketedBandit([OFF, SUFFIX, LEARNED, HYBRID], BanditConfig(epsilon=0.5, min_samples_for_guard=10**6))
    for _ in range(8):  # at batch 1 the learned arm is the best, suffix second, off last
        b.observe(1, OFF, 1, 0.010)
        b.observe(1, SUFFIX, 1.3, 0.010)
        b.observe(1, LEARNED, 2.0, 0.010)
        b.observe(1, HYBRID, 1.5, 0.010)
    return b


def test_gated_arms_are_never_played_and_best_falls_back():
    bandit = _bandit()
    table = bandit.table()
    assert table["buckets"][0]["best"] == LEARNED.name
    gated = gate_table(table, ["learned", "hybrid"])
    b0 = gated["buckets"][0]
    assert b0["best"] == OFF.name  # the gate does not promote another arm: off is the safe choice
    assert b0["explore"] == [SUFFIX.name] and not b0["probe"]
    assert b0["gated"] == sorted([LEARNED.name, HYBRID.name])
    assert b0["explore_p"] == []  # priced against the gated best: epsilon / n instead
    assert table["buckets"][0]["best"] == LEARNED.name  # the original table is not modified
    policy = TablePolicy(gated, seed=0)
    played = {policy.choose(1).name for _ in range(400)}
    assert played == {OFF.name, SUFFIX.name}
    # gating an arm that is not the best keeps the others' priced probabilities, aligned with explore
    hyb = gate_table(table, ["hybrid"])["buckets"][0]
    p = dict(zip(table["buckets"][0]["explore"], table["buckets"][0]["explore_p"]))
    assert hyb["best"] == LEARNED.name and hyb["explore_p"] == [p[n] for n in hyb["explore"]]
    assert HYBRID.name not in hyb["explore"] and len(hyb["explore"]) == 2
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


def test_bad_threshold_is_a_config_error():
    with pytest.raises(ConfigError, match="tuner.learned_min_top1"):
        load_config(None, ["tuner.learned_min_top1=1.5"])
