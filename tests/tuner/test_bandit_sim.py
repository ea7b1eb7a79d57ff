"""The bandit on a simulated cost model: convergence per bucket, time vs the oracle, the regret guard.

Cost model (``services/tuner/sim.py``): step time = base + c * batch * verify_tokens (+ draft cost), with
log-normal noise; committed tokens per request = 1 + a truncated-geometric number of accepted draft tokens
with a known per-arm acceptance rate. The arms are tuned so that three buckets have three different best
arms: a deep draft tree at batch 1, a shallow suffix chain at batch 8..12, plain decoding at batch 64..100.

Stated bound: over 40 simulated rollouts (4,000 decode steps), the bandit needs at most 10% more wall time
than the oracle (which plays the best arm for every batch size from the start) to commit the same tokens,
for each of three seeds. Observed: 3-4.5% (6.5-8.2% without the exploration regret budget; always-off:
+32%).
"""

import collections
import dataclasses
import random

import pytest

from services.tuner.arms import OFF, Arm, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
from services.tuner.sim import ArmProfile, CostModel, FixedPolicy, run

PROFILES = {
    "ngram-k2-w1": ArmProfile(alpha=0.55, draft_ms_per_request=0.02),
    "suffix-k4-w1": ArmProfile(alpha=0.72, draft_ms_per_request=0.02),
    "suffix-k10-w1": ArmProfile(alpha=0.66, draft_ms_per_request=0.02),
    "learned-k6-w1": ArmProfile(alpha=0.74, draft_ms_per_level=1.0),
    "learned-k16-w2-d8": ArmProfile(alpha=0.70, draft_ms_per_level=1.0),
    # A drafter that is almost never right: much slower than off at every batch size.
    "hybrid-k16-w1": ArmProfile(alpha=0.10, draft_ms_per_level=0.6, draft_ms_per_request=0.02),
}
ARMS = parse_arms(["off", *PROFILES])
MODEL = CostModel(base_ms=10.0, c_ms=0.25, time_sigma=0.05, profiles=PROFILES)
BAD = "hybrid-k16-w1"
# bucket edges [1, 2, 4, 8, 16, 32, 64, 128, 256]: batch 1 -> bucket 0, 8..12 -> 3, 64..100 -> 6
PHASES = [((64, 100), 30, "off"), ((8, 12), 30, "suffix-k4-w1"), ((1, 1), 40, "learned-k16-w2-d8")]
BEST = {0: "learned-k16-w2-d8", 3: "suffix-k4-w1", 6: "off"}
SEEDS = [0, 1, 2]


def schedule(rounds: int, seed: int):
    """Batch sizes of ``rounds`` simulated rollouts: the batch shrinks from 64..100 to 8..12 to 1."""
    rng = random.Random(seed)
    for _ in range(rounds):
        for (lo, hi), steps, _ in PHASES:
            for _ in range(steps):
                yield rng.randint(lo, hi)


def test_cost_model_has_a_different_best_arm_per_bucket():
    bandit = BucketedBandit(ARMS)
    for (lo, hi), _, best in PHASES:
        for b in range(lo, hi + 1):
            assert MODEL.best_arm(ARMS, b).name == best
            assert BEST[bandit.bucket_of(b)] == best
            ranked = sorted(ARMS, key=lambda a: MODEL.seconds_per_token(a, b))
            # the best arm is at least 5% faster than the runner-up: a clear but not trivial target
            assert MODEL.seconds_per_token(ranked[1], b) > 1.05 * MODEL.seconds_per_token(ranked[0], b)
        bad = Arm.from_name(BAD)
        assert MODEL.seconds_per_token(bad, hi) > 1.9 * MODEL.seconds_per_token(OFF, hi)


@pytest.fixture(scope="module")
def runs():
    out = {}
    for seed in SEEDS:
        bandit = BucketedBandit(ARMS, BanditConfig(seed=seed))
        out[seed] = (bandit, run(bandit, MODEL, ARMS, schedule(40, seed), seed=seed))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_converges_to_best_arm_in_each_bucket(runs, seed):
    bandit, res = runs[seed]
    last = collections.defaultdict(collections.Counter)
    for b, name in res.choices[-2000:]:  # last 20 rollouts: 600 / 600 / 800 steps per bucket
        last[bandit.bucket_of(b)][name] += 1
    for bucket, best in BEST.items():
        name, count = last[bucket].most_common(1)[0]
        assert name == best, (bucket, last[bucket])
        assert count >= 0.75 * sum(last[bucket].values()), (bucket, last[bucket])
        # The final table's best is the best arm or a near-tie. The default estimate (throughput over a
        # 64-step window) is unbiased but noisier than a median on this model's skewed tree accepts, so at
        # one snapshot it can rank an arm a little slower first (seen once in 12 seeds: suffix-k4 at batch
        # 1, 12% slower, for seed 2); the plays above and the time bound below are the criteria.
        (lo, hi), _, _ = next(p for p in PHASES if p[2] == best)
        for chosen in (bandit.best_arms()[bucket], bandit.table()["buckets"][bucket]["best"]):
            for b in range(lo, hi + 1):
                ratio = MODEL.seconds_per_token(Arm.from_name(chosen), b) / MODEL.seconds_per_token(
                    Arm.from_name(best), b
                )
                assert ratio <= 1.15, (bucket, chosen, b, ratio)


@pytest.mark.parametrize("seed", SEEDS)
def test_cumulative_time_within_10_percent_of_oracle(runs, seed):
    _, res = runs[seed]
    assert res.steps == 4000
    assert res.ratio <= 1.10, res.summary()
    # and it beats every fixed strategy by a wide margin
    for arm in (OFF, Arm.from_name("suffix-k4-w1"), Arm.from_name("learned-k16-w2-d8")):
        fixed = run(FixedPolicy(arm), MODEL, ARMS, schedule(40, seed), seed=seed)
        assert res.ratio < fixed.ratio - 0.05, (arm.name, res.summary(), fixed.summary())


@pytest.mark.parametrize("seed", SEEDS)
def test_regret_guard_bounds_plays_of_a_bad_arm(runs, seed):
    bandit, res = runs[seed]
    big = [name for b, name in res.choices if b >= 64]
    # ~10x slower than off at batch 64..100: one untried play, one more to confirm, then rare probes
    assert big.count(BAD) <= 6, big.count(BAD)
    assert bandit.is_guarded(64, BAD)
    # arms that lose to off at large batch are guarded there too, so off keeps the bucket to itself
    assert sum(1 for n in big[-1000:] if n != "off") <= 60
    # without the guard and the exploration budget (plain epsilon-greedy) the bad arm keeps being explored
    no_guard = BanditConfig(seed=seed, min_samples_for_guard=10**6, explore_regret_budget=None)
    plain = run(BucketedBandit(ARMS, no_guard), MODEL, ARMS, schedule(40, seed), seed=seed)
    assert sum(1 for b, n in plain.choices if b >= 64 and n == BAD) > 2 * big.count(BAD)
    assert res.seconds < plain.seconds


def test_ucb_guard_rule_and_ratio_estimator_also_converge():
    for cfg in (BanditConfig(seed=3, guard_rule="ucb"), BanditConfig(seed=3, estimator="ratio")):
        bandit = BucketedBandit(ARMS, cfg)
        res = run(bandit, MODEL, ARMS, schedule(30, 3), seed=3)
        assert res.ratio <= 1.12, (cfg, res.summary())
        assert bandit.best_arms()[6] == "off"
        assert bandit.best_arms()[3] == "suffix-k4-w1"


def _distributed(seed: int) -> tuple[BucketedBandit, float, int]:
    """Four actors play in-process table copies; the central bandit merges their observations and
    republishes its table every 25 steps of each actor. Returns the central bandit, the time over the
    oracle's, and the plays of the bad arm at batch >= 64."""
    central = BucketedBandit(ARMS, BanditConfig(seed=seed))
    actors = [TablePolicy(central.table(), seed=100 + i) for i in range(4)]
    scheds = [list(schedule(20, 10 + i)) for i in range(4)]
    rng = random.Random(seed)
    secs = oracle = 0.0
    bad_plays = 0
    for start in range(0, len(scheds[0]), 25):
        for actor, sched in zip(actors, scheds):
            for b in sched[start : start + 25]:
                arm = actor.choose(b)
                tok, sec = MODEL.sample(arm, b, rng)
                actor.observe(b, arm, tok, sec)
                bad_plays += b >= 64 and arm.name == BAD
                secs += sec
                oracle += tok * MODEL.seconds_per_token(MODEL.best_arm(ARMS, b), b)
        for actor in actors:
            central.merge(actor.drain_observations())
        table = central.table()
        for actor in actors:
            actor.update(table)
    assert central.stats()["chosen"] == 4 * len(scheds[0])
    return central, secs / oracle, bad_plays


def test_distributed_actors_with_table_policies_converge():
    """Three seeds. Batch 1's best (``learned-k16-w2-d8``) is 5% ahead of the runner-up and has 800 steps per
    actor to be found in: found in 11 of seeds 5-16, with the actors' regret ledger as without it (the
    ledger changes which draws are made, so which seed misses), hence "at least two of three" here."""
    runs = [_distributed(seed) for seed in (5, 6, 7)]
    assert sum(c.best_arms()[0] == BEST[0] for c, _, _ in runs) >= 2
    for central, time_ratio, bad_plays in runs:
        assert central.best_arms()[3] == BEST[3]
        assert central.best_arms()[6] == BEST[6]
        # 4 actors: each probes it once per table version while it is untried / on probation
        assert bad_plays <= 16
        assert time_ratio <= 1.15
        stats = central.stats()
        # explored, but well below epsilon (0.1): the regret budget prices the arms that lose
        assert 0.01 < stats["exploration_fraction"] < 0.1
        assert stats["dropped"] == 0


@pytest.mark.parametrize("estimator", ["capped", "median"])
def test_estimate_is_robust_to_stalls(estimator):
    """3% of steps stall for 5x their time (GC pauses, hiccups), whatever the arm: the default estimate
    counts a stalled step as at most ``stall_cap`` (2) typical ones, the window median ignores them."""
    stalls = dataclasses.replace(MODEL, stall_prob=0.03, stall_factor=5.0)
    bandit = BucketedBandit(ARMS, BanditConfig(seed=4, estimator=estimator))
    res = run(bandit, stalls, ARMS, schedule(40, 4), seed=4)
    assert res.ratio <= 1.10, res.summary()
    assert all(bandit.best_arms()[k] == best for k, best in BEST.items())


def test_follows_a_drafter_that_improves():
    """The learned drafter starts untrained (nearly useless) and gets good after a new version is loaded:
    the bandit first avoids it, then, after ``reset_arms("learned")``, adopts it where it is best. Without
    the reset, guards still lift after ``guard_max_hold`` steps of the bucket and it is found as well."""
    weak = dict(PROFILES)
    weak["learned-k16-w2-d8"] = ArmProfile(alpha=0.15, draft_ms_per_level=1.0)
    weak["learned-k6-w1"] = ArmProfile(alpha=0.15, draft_ms_per_level=1.0)
    before = dataclasses.replace(MODEL, profiles=weak)
    bandit = BucketedBandit(ARMS, BanditConfig(seed=6))
    run(bandit, before, ARMS, schedule(20, 6), seed=6)
    assert bandit.best_arms()[0] == "suffix-k4-w1"  # best without a useful learned drafter
    assert bandit.is_guarded(64, "learned-k16-w2-d8")
    bandit.reset_arms("learned")  # new drafter version
    res = run(bandit, MODEL, ARMS, schedule(20, 7), seed=7)
    assert bandit.best_arms()[0] == "learned-k16-w2-d8"
    assert bandit.best_arms()[3] == "suffix-k4-w1" and bandit.best_arms()[6] == "off"
    assert res.ratio <= 1.10, res.summary()
    blind = BucketedBandit(ARMS, BanditConfig(seed=6))
    run(blind, before, ARMS, schedule(20, 6), seed=6)
    run(blind, MODEL, ARMS, schedule(20, 7), seed=7)
    assert blind.best_arms()[0] == "learned-k16-w2-d8"
