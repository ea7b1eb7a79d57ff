"""The selector's counterfactual records of shorter chains: timed by the step's verify width
(``services/tuner/step_cost.py``), and none from a step whose drafts the step quota cut. Public API only."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import StepObservation
from services.tuner.arms import parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit
from services.tuner.budgets import BudgetConfig
from services.tuner.selector import StrategySelector
from services.tuner.step_cost import COST_FIT_MIN_STEPS, CostFit

K4, K8 = "suffix-k4-w1", "suffix-k8-w1"


def test_the_cost_fit_recovers_a_line_and_waits_for_steps_and_spread():
    fit = CostFit(size=32)
    for k in range(COST_FIT_MIN_STEPS - 1):
        fit.add(1 + k, 0.004 + 0.0005 * (1 + k))
    assert fit.line() is None  # too few steps
    fit.add(20, 0.004 + 0.0005 * 20)
    a, b = fit.line()
    assert a == pytest.approx(0.004) and b == pytest.approx(0.0005)
    same = CostFit()
    for _ in range(20):
        same.add(9, 0.01)
    assert same.line() is None  # one width: no slope to fit
    falling = CostFit()
    for k in range(20):
        falling.add(1 + k, 0.02 - 0.0001 * k)
    assert falling.line()[1] == 0.0  # clamped: a wider step costs the same, not less
    # the window slides: the old line is forgotten; a cost proportional to the width (no intercept) is no fit
    for k in range(32):
        fit.add(1 + k % 8, 0.003 + 0.001 * (1 + k % 8))
    assert fit.line() == pytest.approx((0.003, 0.001))
    for k in range(32):
        fit.add(1 + k % 8, 0.001 * (1 + k % 8))
    assert fit.line() is None


def _requests(n):
    return [DraftRequest(f"r{j}", f"p{j}", [1, 2, 3], 2) for j in range(n)]


def _table(b, k4, k8):
    """A table at batch size ``b`` from earlier rollouts: off commits ``b`` tokens in 10 ms, k4 and k8
    ``(tokens, seconds)`` per step."""
    bandit = BucketedBandit(parse_arms(["off", K4, K8]), BanditConfig(regret_budget=0.0))
    for _ in range(8):
        bandit.observe(b, "off", b, 0.010)
        bandit.observe(b, K4, *k4)
        bandit.observe(b, K8, *k8)
    table = bandit.table()
    assert table["buckets"][bandit.bucket_of(b)]["best"] == K8
    return table


def _play(sel, b, steps, rng):
    """``steps`` steps of ``b`` requests: each request's draft stops after 4 to 7 nodes (or its budget), nothing
    past the 2nd node is accepted, and a step costs 5 ms + 0.5 ms per verified token. Returns the arms played."""
    played = []
    for _ in range(steps):
        strategies = sel.choose(_requests(b))
        played.append(next(iter(sel.drain_choices())))
        drafts = tuple(min(s.max_draft_tokens, rng.randint(4, 7)) for s in strategies)
        acc = tuple(min(d, 2) for d in drafts)
        seconds = 0.005 + 0.0005 * (b + sum(drafts))
        obs = StepObservation(b, strategies[0].name, b + sum(acc), sum(drafts), sum(acc), seconds)
        sel.observe(replace(obs, draft_lengths=drafts, accepted_lengths=acc))
    return played


def test_a_shorter_chains_records_are_timed_by_the_steps_width_not_by_means_of_other_moments():
    # the table (earlier rollouts) says k4's steps took 12 ms and k8's 10 ms, and k8 commits more. Now k4
    # commits what k8 does (nothing past the 2nd node is accepted) in a step of 5 verified tokens instead of
    # 5-8. Timed by the table's means (1.2x k8's step), k4's records from k8's steps look slower than k8's and
    # k8 would stay (the regret budget is nil: k4 is never explored, only judged on k8's steps)
    sel = StrategySelector(_table(1, (1.5, 0.012), (3, 0.010)), clock="engine")
    played = _play(sel, 1, 120, random.Random(1))
    assert played[:COST_FIT_MIN_STEPS] == [K8] * COST_FIT_MIN_STEPS and played[-20:] == [K4] * 20, played


@pytest.mark.parametrize("quota", [512, 16])
def test_a_step_whose_drafts_the_quota_cut_says_nothing_of_the_shorter_chains(quota):
    # as above at 4 requests. With a step quota of 16 draft tokens, k8's step drafts 8 for two requests and
    # none for the others, where k4 would draft 4 for each: that step is no evidence on k4, which is then
    # never judged and never played
    sel = StrategySelector(
        _table(4, (8, 0.012), (12, 0.010)), budgets=BudgetConfig(step_quota=quota), clock="engine"
    )
    played = _play(sel, 4, 120, random.Random(3))
    if quota == 512:
        assert played[-20:] == [K4] * 20, played
    else:
        assert set(played) == {K8}, played
