"""One rollout actor (``TablePolicy``) and the central tuner on the long-tail benchmark's batch schedules,
simulated: never slower than plain decoding where plain decoding is the best arm, faster where a drafter pays.

Schedules (batch size, decode steps) mimic ``benchmarks/rollout_longtail.py``: a batch-1 rollout of 1,000 steps,
and batch 4 / 16 / 64 rollouts whose batch shrinks to 1 in their long tail. A table is published after each
rollout. Each rollout draws its own acceptance factor (log-normal, sigma 0.35): prompts differ in how much a
suffix or n-gram drafter finds to copy. Cost model ``services/tuner/sim.py`` (base 2 ms, 0.27 ms per verified
token and request: a small model on a CPU, where a draft costs about as much as on the benchmark's machine).

Asserted on the steady state (rollouts 4-9 of 10, 4 seeds), as speed vs always-off (off's seconds for the same
committed tokens / the actor's seconds):

* drafters weak (acceptance x 0.55: ``off`` is the best arm at every batch size): >= 0.99 at every schedule;
* drafters as profiled (``suffix-k4`` ~1.2x off at batch 1 on an average rollout): >= 1.04 at batch 1 on
  average and >= 1.2 in at least one seed, and >= 0.99 at the other schedules.

Measured at 16 seeds and rollouts 4-11 of 12: weak 0.998 / 0.999 / 1.000 / 1.001, profiled 1.110 / 1.042 /
1.010 / 1.007 at batch 1 / 4 / 16 / 64 (before the ledger had one balance per arm and free arms: 0.998 / 0.998
/ 0.996 / 0.999 and 0.997 / 0.998 / 0.997 / 0.998: the profiled batch-1 gain was never found). Batch 1 is
bimodal per seed: the gain is found (1.2-1.55) or not yet (~1.0; in 6 of 16 seeds, e.g. after a streak of
rollouts with low acceptance left ``suffix-k4`` estimated just below off, it waits on its ledger debt); the
four seeds here: 1.55 / 1.03 / 1.00 / 1.00, mean 1.14.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from services.tuner.arms import OFF, default_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
from services.tuner.sim import ArmProfile, CostModel

PROFILES = {
    "ngram-k3-w1": ArmProfile(alpha=0.12, draft_ms_per_request=0.01),
    "suffix-k4-w1": ArmProfile(alpha=0.45, draft_ms_per_request=0.01),
    "suffix-k8-w1": ArmProfile(alpha=0.5, draft_ms_per_request=0.01),
    "suffix-k12-w1": ArmProfile(alpha=0.32, draft_ms_per_request=0.01),
    "suffix-k24-w3-d8": ArmProfile(alpha=0.25, draft_ms_per_request=0.03),
    "learned-k2-w1": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
    "learned-k4-w1": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
    "learned-k12-w2-d6": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
    "hybrid-k8-w1": ArmProfile(alpha=0.25, draft_ms_per_level=0.5, draft_ms_per_request=0.01),
}
# (batch size, steps) of one rollout per benchmark batch size: the batch shrinks into the long tail
SCHEDULES = {
    1: [(1, 1000)],
    4: [(4, 100), (3, 60), (2, 50), (1, 60)],
    16: [(16, 120), (12, 40), (8, 40), (4, 30), (2, 20), (1, 40)],
    64: [(64, 120), (48, 30), (32, 30), (16, 25), (8, 12), (4, 7), (2, 5), (1, 40)],
}
SEEDS = range(4)
ROLLOUTS, STEADY_FROM = 10, 4
SIGMA = 0.35  # rollout-to-rollout log-normal spread of the drafters' acceptance


def model(scale: float, factor: float) -> CostModel:
    """The cost model of one rollout: every non-learned drafter's acceptance times ``scale * factor``."""
    profiles = {
        name: dataclasses.replace(
            p, alpha=min(0.95, p.alpha * scale * (1.0 if name.startswith("learned") else factor))
        )
        for name, p in PROFILES.items()
    }
    return CostModel(base_ms=2.0, c_ms=0.27, time_sigma=0.15, profiles=profiles)


def steady_speeds(scale: float, seed: int) -> dict[int, list[float]]:
    """Speed vs always-off of each steady-state rollout, per schedule."""
    rng = random.Random(seed)
    central = BucketedBandit(default_arms(), BanditConfig(seed=seed))
    policy = TablePolicy(central.table(), seed=seed + 100)
    speeds: dict[int, list[float]] = {bs: [] for bs in SCHEDULES}
    for r in range(ROLLOUTS):
        for bs, schedule in SCHEDULES.items():
            m = model(scale, math.exp(rng.gauss(0.0, SIGMA)))
            seconds = off_seconds = 0.0
            for batch, steps in schedule:
                for _ in range(steps):
                    arm = policy.choose(batch)
                    tokens, s = m.sample(arm, batch, rng)
                    policy.observe(batch, arm, tokens, s)
                    seconds += s
                    off_seconds += tokens * m.seconds_per_token(OFF, batch)
            central.merge(policy.drain_observations())
            policy.update(central.table())
            if r >= STEADY_FROM:
                speeds[bs].append(off_seconds / seconds)
    return speeds


@pytest.fixture(scope="module")
def runs() -> dict[float, list[dict[int, list[float]]]]:
    return {scale: [steady_speeds(scale, seed) for seed in SEEDS] for scale in (0.55, 1.0)}


@pytest.fixture(scope="module")
def speeds(runs) -> dict[float, dict[int, float]]:
    """Scale -> schedule -> mean steady-state speed vs always-off over the seeds."""
    return {
        scale: {bs: statistics.fmean(x for s in per_seed for x in s[bs]) for bs in SCHEDULES}
        for scale, per_seed in runs.items()
    }


@pytest.fixture(scope="module")
def per_seed_batch1(runs) -> list[float]:
    return [statistics.fmean(s[1]) for s in runs[1.0]]


def test_the_simulated_drafters_make_the_two_cases():
    arms = default_arms()
    weak, profiled = model(0.55, 1.0), model(1.0, 1.0)
    for b in (1, 4, 16, 64):
        assert weak.best_arm(arms, b) == OFF
    best = profiled.best_arm(arms, 1)
    assert best.name == "suffix-k4-w1"
    assert profiled.seconds_per_token(OFF, 1) / profiled.seconds_per_token(best, 1) > 1.15
    assert profiled.best_arm(arms, 64) == OFF


def test_never_slower_than_plain_where_plain_is_best(speeds):
    for bs, speed in speeds[0.55].items():
        assert speed >= 0.99, (bs, speeds[0.55])


def test_faster_than_plain_where_a_drafter_pays(speeds, per_seed_batch1):
    assert speeds[1.0][1] >= 1.04, speeds[1.0]
    assert max(per_seed_batch1) >= 1.2, per_seed_batch1
    for bs in (4, 16, 64):
        assert speeds[1.0][bs] >= 0.99, (bs, speeds[1.0])
