"""A rollout actor's TablePolicy demotes the table's drafting best to off when its own plays of it, under this
table version, are reliably below the table's off estimate (``BanditConfig.demote_samples``)."""

import random

import pytest

from services.tuner.arms import OFF, Arm, TunerConfigError
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
from services.tuner.grpc_service import table_from_pb, table_to_pb

SUFFIX = Arm.from_name("suffix-k8-w1")
NGRAM = Arm.from_name("ngram-k3-w1")


def central_with_suffix_best(cfg: BanditConfig | None = None, jitter: float = 0.05) -> BucketedBandit:
    """Bucket of batch 1: off at 100 tok/s, suffix at 150 tok/s (64 samples each, step seconds jittered by
    +-``jitter``), so suffix is the best."""
    bandit = BucketedBandit([OFF, SUFFIX], cfg or BanditConfig(epsilon=0.0, explore_regret_budget=None))
    rng = random.Random(0)
    for _ in range(64):
        bandit.observe(1, OFF, 1, 0.01 * rng.uniform(1 - jitter, 1 + jitter))
        bandit.observe(1, SUFFIX, 1.5, 0.01 * rng.uniform(1 - jitter, 1 + jitter))
    return bandit


def play(policy: TablePolicy, steps: int, rate: float, rng: random.Random) -> list[str]:
    """``steps`` greedy decode steps at batch 1; the suffix arm commits ``rate`` tokens per 10 ms step."""
    chosen = []
    for _ in range(steps):
        arm = policy.choose(1)
        chosen.append(arm.name)
        tokens = 1.0 if arm.is_off else rate
        policy.observe(1, arm, tokens, 0.01 * rng.uniform(0.95, 1.05))
    return chosen


def test_table_carries_off_estimate_and_demote_settings():
    bandit = central_with_suffix_best()
    table = bandit.table()
    b0 = table["buckets"][0]
    assert b0["best"] == SUFFIX.name
    assert b0["off_estimate"] == pytest.approx(100.0, rel=0.03)
    assert table["buckets"][1]["off_estimate"] is None  # no off samples there
    cfg = bandit.cfg
    assert table["demote"] == {
        "samples": cfg.demote_samples,
        "z": cfg.best_z,
        "margin": cfg.guard_margin,
        "cv_floor": cfg.guard_cv_floor,
        "stall_cap": cfg.stall_cap,
    }
    # and through the gRPC message the actors receive
    back = table_from_pb(table_to_pb(table))
    assert back["demote"] == table["demote"]
    assert back["buckets"][0]["off_estimate"] == pytest.approx(b0["off_estimate"])
    assert back["buckets"][1]["off_estimate"] is None


def test_a_best_that_loses_to_off_here_is_demoted_for_the_rest_of_the_table_version():
    bandit = central_with_suffix_best()
    policy = TablePolicy(bandit.table(), seed=0)
    rng = random.Random(1)
    chosen = play(policy, 200, rate=0.5, rng=rng)  # here suffix commits half of off's tokens per second
    n_suffix = chosen.count(SUFFIX.name)
    assert n_suffix == bandit.cfg.demote_samples  # demoted at the first check
    assert chosen[:n_suffix] == [SUFFIX.name] * n_suffix and set(chosen[n_suffix:]) == {OFF.name}
    assert policy.demotions == {0: 1}
    obs = policy.drain_observations()
    assert sum(o["arm"] == SUFFIX.name and not o["explored"] for o in obs) == n_suffix  # the tuner sees them
    # a new table version restores the best (the tuner decides with the new evidence)
    policy.update(bandit.table())
    assert policy.choose(1) == SUFFIX


def test_a_best_at_par_with_off_is_not_demoted():
    bandit = central_with_suffix_best()
    policy = TablePolicy(bandit.table(), seed=0)
    chosen = play(policy, 300, rate=1.0, rng=random.Random(2))  # as fast as off: not reliably below
    assert set(chosen) == {SUFFIX.name}
    assert policy.demotions == {}


def test_the_cv_floor_delays_demotion_of_a_mildly_worse_best():
    """At 0.85x off's throughput with no spread at all (empirical se 0), the floor ``cv_floor * R / sqrt(n)``
    keeps the best at 16 plays (85 + 10.6 > 95) and demotes it at the next check, 20 plays (85 + 9.5 < 95)."""
    bandit = central_with_suffix_best(jitter=0.0)
    table = bandit.table()
    assert table["buckets"][0]["off_estimate"] == pytest.approx(100.0)
    policy = TablePolicy(table, seed=0)
    chosen = []
    for _ in range(40):
        arm = policy.choose(1)
        chosen.append(arm.name)
        policy.observe(1, arm, 0.85 if not arm.is_off else 1.0, 0.01)
    assert chosen.count(SUFFIX.name) == 20 and chosen[20:] == [OFF.name] * 20


def test_explored_plays_and_other_buckets_do_not_count():
    bandit = central_with_suffix_best()
    table = bandit.table()
    table["buckets"][0]["explore"] = [NGRAM.name]
    table["buckets"][0]["explore_p"] = [1.0]
    table["arms"][NGRAM.name] = NGRAM.to_dict()
    table["ledger"] = None  # (the regret ledger would stop exploring so slow an arm after one play)
    policy = TablePolicy(table, seed=0)
    for _ in range(64):  # every step explores ngram (a drafting arm, slow): never the best's evidence
        arm = policy.choose(1)
        assert arm == NGRAM
        policy.observe(1, arm, 0.2, 0.01)
    assert policy.demotions == {}


def test_demotion_off_and_bad_settings():
    cfg = BanditConfig(epsilon=0.0, explore_regret_budget=None, demote_samples=None)
    bandit = central_with_suffix_best(cfg)
    assert bandit.table()["demote"] is None
    policy = TablePolicy(bandit.table(), seed=0)
    assert set(play(policy, 100, rate=0.3, rng=random.Random(4))) == {SUFFIX.name}
    # a table from an older tuner (no demote settings, no off estimate) is accepted: no demotion
    old = central_with_suffix_best().table()
    del old["demote"]
    for b in old["buckets"]:
        del b["off_estimate"]
    assert set(play(TablePolicy(old, seed=0), 100, rate=0.3, rng=random.Random(4))) == {SUFFIX.name}
    bad = central_with_suffix_best().table()
    bad["demote"] = {"samples": 16}
    with pytest.raises(TunerConfigError, match="demote"):
        TablePolicy(bad)
    with pytest.raises(TunerConfigError, match="demote_samples"):
        BanditConfig(demote_samples=1)


def test_the_demotion_test_backs_off_but_still_catches_a_best_that_turns_bad_late():
    """After ``samples`` plays the test runs after each further quarter of the plays so far (at most every half
    window, 64 plays at the default 16 samples): a best that held for 400 plays and then drops to 0.6x off is
    demoted within a window and a half of plays, and the tests run far less often than every 4th play."""
    policy = TablePolicy(central_with_suffix_best().table())
    rng = random.Random(1)
    tests = []

    class Spy(dict):  # the test records when it runs next: one entry per test run
        def __setitem__(self, k, v):
            tests.append(v)
            super().__setitem__(k, v)

    policy._best_next = Spy()
    assert set(play(policy, 400, 1.5, rng)) == {SUFFIX.name}
    assert 6 <= len(tests) <= 20  # every 4th play would be 97 tests
    chosen = play(policy, 400, 0.6, rng)
    first_off = chosen.index(OFF.name)
    assert first_off <= 192 and set(chosen[first_off:]) == {OFF.name}
    assert policy.demotions == {0: 1}
