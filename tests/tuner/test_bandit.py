"""Unit behaviour of the bucketed bandit: buckets, choice order, the regret guard's life cycle, config errors,
and the in-process TablePolicy."""

import math

import pytest

from services.tuner.arms import OFF, Arm, TunerConfigError, default_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy

SUFFIX = Arm.from_name("suffix-k8-w1")
NGRAM = Arm.from_name("ngram-k3-w1")
LEARNED = Arm.from_name("learned-k4-w1")
HYBRID = Arm.from_name("hybrid-k8-w1")


def feed(bandit, arm, n, rate, seconds=0.1, batch=1):
    for _ in range(n):
        bandit.observe(batch, arm, rate * seconds, seconds)


def test_bucket_of():
    bandit = BucketedBandit(cfg=BanditConfig(bucket_edges=[1, 2, 4, 8, 16, 32, 64, 128, 256]))
    assert [bandit.bucket_of(b) for b in (0, 1, 2, 3, 4, 7, 8, 63, 64, 255, 256, 10**6)] == [
        0, 0, 1, 1, 2, 2, 3, 5, 6, 7, 8, 8,
    ]  # fmt: skip
    assert bandit.bucket_range(1) == (2, 4)
    assert bandit.bucket_range(8) == (256, None)
    with pytest.raises(ValueError, match="batch_size"):
        bandit.bucket_of(-1)
    assert BucketedBandit(cfg=BanditConfig(bucket_edges=[4, 16])).bucket_of(2) == 0


def test_default_arms_and_off_always_present():
    bandit = BucketedBandit()
    assert bandit.arms == default_arms()
    assert BucketedBandit([SUFFIX]).arms == [OFF, SUFFIX]


def test_untried_first_then_greedy_and_exploration():
    # one sample is enough to compete here (the default min_samples_for_best is 4: test_estimate_and_clock.py)
    # plain epsilon-greedy (no regret budget): test_explore_regret_budget_* cover the budgeted default
    cfg = BanditConfig(epsilon=0.0, min_samples_for_best=1, explore_regret_budget=None)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    tried = []
    for _ in range(3):
        arm = bandit.choose(1)
        tried.append(arm.name)
        feed(bandit, arm, 1, {"off": 100, "suffix-k8-w1": 300, "ngram-k3-w1": 200}[arm.name])
    assert tried == ["off", "suffix-k8-w1", "ngram-k3-w1"]  # config order
    assert all(bandit.choose(1) == SUFFIX for _ in range(50))  # greedy on the median
    # another bucket starts untried again
    assert bandit.choose(8) == OFF
    # epsilon = 1: always one of the other eligible arms, never the best
    bandit.cfg.epsilon = 1.0
    picks = {bandit.choose(1).name for _ in range(200)}
    assert picks == {"off", "ngram-k3-w1"}
    st = bandit.stats()["buckets"][0]
    assert st["arms"]["suffix-k8-w1"]["chosen"] == 51
    assert st["explored"] == 3 + 200


def test_guard_life_cycle_window_turnover_probation_and_backoff():
    cfg = BanditConfig(
        window=8,
        epsilon=1.0,
        explore_regret_budget=None,
        min_samples_for_guard=4,
        guard_regret_budget=1.0,
        fast_guard_cost=1e9,
        seed=1,
    )
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    feed(bandit, OFF, 4, 100)
    feed(bandit, NGRAM, 4, 200)
    feed(bandit, SUFFIX, 3, 50)
    assert not bandit.is_guarded(1, SUFFIX)  # 3 < k samples
    feed(bandit, SUFFIX, 1, 50)
    assert bandit.is_guarded(1, SUFFIX)  # upper quartile 50 < 0.95 * 100
    assert not bandit.is_guarded(2, SUFFIX)  # per bucket
    # guarded: never chosen, not even by exploration (epsilon = 1 explores only off)
    assert {bandit.choose(1).name for _ in range(100)} == {"off"}
    table = bandit.table()["buckets"][0]
    assert (
        table["best"] == "ngram-k3-w1"
        and table["explore"] == ["off"]
        and table["guarded"] == ["suffix-k8-w1"]
    )
    # window turnover: guard_hold = window = 8 further observations of off lift it
    feed(bandit, NGRAM, 50, 200)  # other arms' traffic does not count (guard_max_hold = 256)
    feed(bandit, OFF, 7, 100)
    assert bandit.is_guarded(1, SUFFIX)
    feed(bandit, OFF, 1, 100)
    assert not bandit.is_guarded(1, SUFFIX)
    st = bandit.stats()["buckets"][0]["arms"]["suffix-k8-w1"]
    assert st["probation"] == 2 and st["n"] == 0
    assert bandit.table()["buckets"][0]["probe"] == ["suffix-k8-w1"]
    assert bandit.choose(1) == SUFFIX  # probes are forced
    # both probes still below off: guarded again, one strike, hold doubles to 16
    feed(bandit, SUFFIX, 2, 50)
    assert bandit.is_guarded(1, SUFFIX)
    assert bandit.stats()["buckets"][0]["arms"]["suffix-k8-w1"]["strikes"] == 1
    feed(bandit, OFF, 15, 100)
    assert bandit.is_guarded(1, SUFFIX)
    feed(bandit, OFF, 1, 100)
    assert not bandit.is_guarded(1, SUFFIX)
    # the drafter got better: a good probe ends probation, strikes reset, and it competes (and wins)
    feed(bandit, SUFFIX, 1, 400)
    st = bandit.stats()["buckets"][0]["arms"]["suffix-k8-w1"]
    assert st["probation"] == 0 and st["strikes"] == 0 and not st["guarded"]
    bandit.cfg.epsilon = 0.0
    assert bandit.choose(1) == SUFFIX


def test_guard_max_hold_lifts_where_off_is_rarely_played():
    cfg = BanditConfig(
        window=8, min_samples_for_guard=4, guard_max_hold=20, guard_regret_budget=1.0, fast_guard_cost=1e9
    )
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    feed(bandit, OFF, 4, 100)
    feed(bandit, SUFFIX, 4, 50)
    assert bandit.is_guarded(1, SUFFIX)
    feed(bandit, NGRAM, 19, 300)
    assert bandit.is_guarded(1, SUFFIX)
    feed(bandit, NGRAM, 1, 300)
    assert not bandit.is_guarded(1, SUFFIX)


def test_guarded_arms_share_the_reprobe_budget():
    """Each guarded arm is re-probed after a hold that scales with the number of guarded arms in the bucket,
    so re-probing all of them costs about ``guard_regret_budget`` of the bucket's time, not that much each."""
    cfg = BanditConfig(min_samples_for_guard=4)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM, LEARNED], cfg)
    feed(bandit, OFF, 4, 100, seconds=0.01)
    feed(bandit, SUFFIX, 2, 20, seconds=0.1)  # play cost 8 off steps: guarded after two samples
    feed(bandit, NGRAM, 2, 20, seconds=0.1)  # the same, second in the bucket
    arms = bandit._buckets[0].arms
    assert arms[SUFFIX.name].guarded and arms[NGRAM.name].guarded
    one = math.ceil(2 * 8 / 0.02)  # probe_samples * play_cost / guard_regret_budget
    # both holds are for two guarded arms (the first one's grew when the second was guarded)
    assert arms[SUFFIX.name].hold == arms[NGRAM.name].hold == 2 * one
    # the expected re-probe cost per off step is the budget: sum(probes * cost / hold) = 2%
    assert sum(2 * 8 / arms[a.name].hold for a in (SUFFIX, NGRAM)) == pytest.approx(0.02)
    # a lone guarded arm gets the whole budget
    solo = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    feed(solo, OFF, 4, 100, seconds=0.01)
    feed(solo, SUFFIX, 2, 20, seconds=0.1)
    assert solo._buckets[0].arms[SUFFIX.name].hold == one


def test_costly_arm_is_guarded_after_two_samples_with_a_long_hold():
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(min_samples_for_guard=4))
    feed(bandit, OFF, 4, 100, seconds=0.01)
    # 10x longer steps at a fifth of off's rate: each play costs 8 off steps of extra time
    feed(bandit, SUFFIX, 1, 20, seconds=0.1)
    assert not bandit.is_guarded(1, SUFFIX)
    feed(bandit, SUFFIX, 1, 20, seconds=0.1)
    assert bandit.is_guarded(1, SUFFIX)
    st = bandit._buckets[0].arms[SUFFIX.name]
    assert st.hold == math.ceil(2 * 8 / 0.02)  # probe_samples * play_cost / guard_regret_budget
    # a mildly slower arm with cheap plays waits for k samples (quantile rule; the default throughput rule
    # waits longer for a mildly slower arm: tests/tuner/test_estimate_and_clock.py)
    bandit2 = BucketedBandit([OFF, SUFFIX], BanditConfig(min_samples_for_guard=4, guard_rule="quantile"))
    feed(bandit2, OFF, 4, 100)
    feed(bandit2, SUFFIX, 3, 80)
    assert not bandit2.is_guarded(1, SUFFIX)
    feed(bandit2, SUFFIX, 1, 80)
    assert bandit2.is_guarded(1, SUFFIX)


def test_no_guard_before_off_has_k_samples_and_off_never_guarded():
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(min_samples_for_guard=4))
    feed(bandit, OFF, 3, 100)
    feed(bandit, SUFFIX, 10, 10)
    assert not bandit.is_guarded(1, SUFFIX)
    feed(bandit, OFF, 1, 100)  # off's 4th sample re-checks the others
    assert bandit.is_guarded(1, SUFFIX)
    feed(bandit, OFF, 100, 1)
    assert not bandit.is_guarded(1, OFF)


def test_close_arm_is_not_guarded():
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(min_samples_for_guard=4, guard_margin=0.05))
    for i in range(40):
        feed(bandit, OFF, 1, 100 + (i % 5))
        feed(bandit, SUFFIX, 1, [99, 95, 102, 97, 101, 94, 100, 96, 98][i % 9])  # a few % below off
        assert not bandit.is_guarded(1, SUFFIX)


def test_ucb_guard_rule():
    cfg = BanditConfig(guard_rule="ucb", min_samples_for_guard=6, fast_guard_cost=1e9, guard_z=2.0)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    for i in range(6):
        feed(bandit, OFF, 1, 100 + 2 * (i % 3))
        feed(bandit, SUFFIX, 1, 60 + 5 * (i % 3))  # clearly below
        feed(bandit, NGRAM, 1, [40, 160, 90][i % 3])  # mean below off but too noisy to be sure
    assert bandit.is_guarded(1, SUFFIX)
    assert not bandit.is_guarded(1, NGRAM)


def test_reset_arms_after_new_drafter_version():
    arms = [OFF, SUFFIX, LEARNED, HYBRID]
    cfg = BanditConfig(min_samples_for_guard=2, min_samples_for_best=2, fast_guard_cost=1e9)
    bandit = BucketedBandit(arms, cfg)
    for b in (1, 64):
        feed(bandit, OFF, 2, 100, batch=b)
        for arm in (SUFFIX, LEARNED, HYBRID):
            feed(bandit, arm, 2, 10, batch=b)
            assert bandit.is_guarded(b, arm)
    assert bandit.reset_arms("learned") == 2 * len(bandit.edges)  # learned and hybrid, every bucket
    for b in (1, 64):
        assert not bandit.is_guarded(b, LEARNED) and not bandit.is_guarded(b, HYBRID)
        assert bandit.is_guarded(b, SUFFIX)
    assert bandit.choose(1) == LEARNED  # untried again: tried first
    bandit.reset_arms()
    assert not bandit.is_guarded(1, SUFFIX)
    assert bandit.stats()["buckets"][0]["arms"]["off"]["n"] == 2  # off's evidence is kept


def test_observe_validation():
    bandit = BucketedBandit([OFF, SUFFIX])
    with pytest.raises(KeyError, match="unknown arm 'medusa-k4-w1'"):
        bandit.observe(1, "medusa-k4-w1", 3, 0.1)
    with pytest.raises(ValueError, match="seconds"):
        bandit.observe(1, OFF, 3, 0.0)
    with pytest.raises(ValueError, match="committed_tokens"):
        bandit.observe(1, OFF, -1, 0.1)
    with pytest.raises(ValueError, match="committed_tokens"):
        bandit.observe(1, OFF, float("nan"), 0.1)
    bandit.observe(1, "suffix-k8-w1", 3, 0.1)  # names work as well as Arm objects
    assert bandit.estimate(1, SUFFIX) == pytest.approx(30.0)
    assert math.isnan(bandit.estimate(1, OFF))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"bucket_edges": []}, "bucket_edges: must list at least one"),
        ({"bucket_edges": [1, 4, 4]}, "strictly increasing"),
        ({"bucket_edges": [0, 4]}, "bucket_edges[0]: must be an integer >= 1"),
        ({"window": 0}, "window: must be an integer >= 1"),
        ({"epsilon": 1.5}, "epsilon: must be a number in [0.0, 1.0]"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"guard_margin": 1.0}, "guard_margin"),
        ({"guard_quantile": 0.0}, "guard_quantile"),
        ({"guard_rule": "thompson"}, "guard_rule: unknown rule 'thompson'"),
        ({"estimator": "mean"}, "estimator: unknown estimator 'mean'"),
        ({"min_samples_for_guard": 0}, "min_samples_for_guard"),
        ({"probe_samples": 0}, "probe_samples"),
        ({"guard_regret_budget": 0}, "guard_regret_budget"),
        ({"explore_regret_budget": 0}, "explore_regret_budget: must be a number in (0.0, 1.0]"),
        ({"explore_regret_budget": 1.5}, "explore_regret_budget"),
        ({"trim": 0.5}, "trim"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_bandit_config_errors(kwargs, fragment):
    with pytest.raises(TunerConfigError) as ei:
        BanditConfig(**kwargs)
    assert fragment in str(ei.value)
    assert str(ei.value).startswith("config: tuner.bandit")


def test_bandit_config_from_dict():
    cfg = BanditConfig.from_dict({"epsilon": 0.2, "bucket_edges": (1, 8, 64)}, source="run.yaml")
    assert cfg.epsilon == 0.2 and cfg.bucket_edges == [1, 8, 64] and cfg.window == 64
    with pytest.raises(TunerConfigError, match=r"run.yaml: tuner.bandit: unknown key\(s\) \['epsilom'\]"):
        BanditConfig.from_dict({"epsilom": 0.2}, source="run.yaml")
    with pytest.raises(TunerConfigError, match="run.yaml: tuner.bandit.window"):
        BanditConfig.from_dict({"window": -3}, source="run.yaml")
    assert BanditConfig.from_dict(BanditConfig(window=7).to_dict()).window == 7


# ---------------------------------------------------------------------------------------------- TablePolicy
def _trained_bandit(**cfg):
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM, LEARNED], BanditConfig(min_samples_for_guard=2, **cfg))
    feed(bandit, OFF, 4, 100)
    feed(bandit, SUFFIX, 4, 300)
    feed(bandit, NGRAM, 4, 200)
    feed(bandit, LEARNED, 4, 10)  # guarded in bucket 0
    return bandit


def test_table_policy_follows_the_table():
    bandit = _trained_bandit()
    table = bandit.table()
    assert table["buckets"][0]["best"] == "suffix-k8-w1"
    assert table["buckets"][0]["guarded"] == ["learned-k4-w1"]
    policy = TablePolicy(table, epsilon=0.0)
    assert {policy.choose(1).name for _ in range(20)} == {"suffix-k8-w1"}
    policy = TablePolicy(table, epsilon=1.0, seed=3)
    assert {policy.choose(1).name for _ in range(100)} == {"off", "ngram-k3-w1"}  # never the guarded arm
    # bucket 6 is untried: each arm is probed once per table version, then the (default) best, off; the
    # learned arm, guarded at batch 1, is not probed at batch 64 (drafts only get costlier with the batch)
    policy = TablePolicy(table, epsilon=0.0)
    assert [policy.choose(64).name for _ in range(5)] == [
        "off", "suffix-k8-w1", "ngram-k3-w1", "off", "off",
    ]  # fmt: skip
    policy.update(bandit.table())
    assert policy.choose(64).name == "off" and policy.choose(64).name == "suffix-k8-w1"


def test_table_policy_observations_round_trip_to_the_bandit():
    bandit = _trained_bandit(explore_regret_budget=None)  # epsilon / n per explore arm
    policy = TablePolicy(bandit.table(), seed=0, max_pending=1000)
    for _ in range(200):
        arm = policy.choose(1)
        policy.observe(1, arm, 10.0, 0.05)
    obs = policy.drain_observations()
    assert len(obs) == 200 and policy.drain_observations() == []
    assert set(obs[0]) == {
        "batch_size",
        "arm",
        "committed_tokens",
        "seconds",
        "explored",
        "table_version",
        "steps",
    }
    n_explored = sum(o["explored"] for o in obs)
    assert 5 <= n_explored <= 40  # epsilon 0.1 from the table
    before = bandit.stats()
    assert bandit.merge(obs + [{"batch_size": 1, "arm": "nope", "committed_tokens": 1, "seconds": 1}]) == 200
    after = bandit.stats()
    assert after["dropped"] == 1
    assert after["chosen"] - before["chosen"] == 200
    assert after["explored"] - before["explored"] == n_explored


def test_table_policy_settled_bucket_and_the_explored_flag():
    """A bucket with nothing to probe or explore returns its best without a draw (the per-step fast path),
    still demoted to off when the actor demotes it; a step counts as explored only when it is the step the
    last ``choose`` drew for exploration (same bucket, same arm)."""
    table = _trained_bandit().table()
    table["buckets"][0].update(explore=[], explore_p=[], probe=[])
    policy = TablePolicy(table, seed=0)
    assert {policy.choose(1).name for _ in range(50)} == {"suffix-k8-w1"}
    policy._demoted.add(0)
    assert policy.choose(1).name == "off"
    policy.update(table)  # a new table version: demotions restart
    assert policy.choose(1).name == "suffix-k8-w1"
    policy.drain_observations()
    # explored steps: drawn by choose at epsilon 1 (never the best), observed for the same batch and arm
    explorer = TablePolicy(_trained_bandit().table(), epsilon=1.0, seed=1)
    arm = explorer.choose(1)
    assert arm.name != "suffix-k8-w1"
    explorer.observe(1, arm, 2, 0.01)  # the step choose drew: explored
    explorer.observe(1, arm, 2, 0.01)  # no choose before it: not explored
    arm2 = explorer.choose(1)
    explorer.observe(64, arm2, 2, 0.01)  # another bucket than the one chosen for: not explored
    assert [o["explored"] for o in explorer.drain_observations()] == [True, False, False]


def test_table_policy_bounded_buffer_and_bad_tables():
    bandit = _trained_bandit()
    policy = TablePolicy(bandit.table(), max_pending=10)
    for _ in range(15):
        policy.observe(1, OFF, 1, 0.01)
    assert len(policy.drain_observations()) == 10 and policy.dropped == 5
    table = bandit.table()
    table["buckets"][0]["best"] = "medusa-k4-w1"
    with pytest.raises(TunerConfigError, match="unknown arm 'medusa-k4-w1'"):
        TablePolicy(table)
    with pytest.raises(TunerConfigError, match="malformed"):
        TablePolicy({"buckets": []})
    with pytest.raises(TunerConfigError, match="epsilon"):
        TablePolicy(bandit.table(), epsilon=2.0)
    table = bandit.table()
    table["buckets"][0]["explore_p"] = [0.5]  # two explore arms, one probability
    with pytest.raises(TunerConfigError, match="bucket 0: explore_p"):
        TablePolicy(table)


# ---------------------------------------------------------------------------------------------- regret budget
def _three_arm_bandit(off_rate, ngram_rate, budget, ngram_samples=8, extra=False):
    """suffix (300 tokens/s) is the best; off and ngram at the given rates; min_samples_for_guard 8.
    ``extra``: a fourth arm, learned, guarded (two samples at a tenth of off's rate, each 10x as long)."""
    cfg = BanditConfig(epsilon=0.1, min_samples_for_guard=8, explore_regret_budget=budget)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM] + ([LEARNED] if extra else []), cfg)
    feed(bandit, OFF, 8, off_rate)
    feed(bandit, SUFFIX, 8, 300)
    feed(bandit, NGRAM, ngram_samples, ngram_rate)
    if extra:
        feed(bandit, LEARNED, 2, off_rate / 10, seconds=1.0)
    return bandit


def test_explore_regret_budget_caps_costly_arms_and_spares_near_ties():
    # off: tokens take 3x as long as suffix's (c = 2); ngram: 1.5x (c = 0.5); budget 1% over n = 2 arms
    b = _three_arm_bandit(100, 200, 0.01).table()["buckets"][0]
    assert b["best"] == "suffix-k8-w1" and b["explore"] == ["off", "ngram-k3-w1"]
    assert b["explore_p"] == pytest.approx([0.01 / (2 * 2.0), 0.01 / (2 * 0.5)])
    # expected extra time of exploration = sum p * c <= the budget
    assert sum(p * c for p, c in zip(b["explore_p"], (2.0, 0.5))) <= 0.01 + 1e-12
    # a near-tie (ngram as fast as suffix) keeps epsilon / n; so does every arm without a budget
    b = _three_arm_bandit(100, 300, 0.01).table()["buckets"][0]
    assert b["explore_p"][1] == pytest.approx(0.05)
    b = _three_arm_bandit(100, 200, None).table()["buckets"][0]
    assert b["explore_p"] == pytest.approx([0.05, 0.05])
    # an arm with fewer than min_samples_for_guard (8) samples: its cost is not known yet, full epsilon / n
    bandit = _three_arm_bandit(100, 200, 0.01, ngram_samples=7)
    assert bandit.table()["buckets"][0]["explore_p"] == pytest.approx([0.01 / (2 * 2.0), 0.05])
    # a guarded arm's share is not handed to the others: with a fourth arm guarded, each share is epsilon / 3
    bandit = _three_arm_bandit(100, 300, 0.01, extra=True)
    b = bandit.table()["buckets"][0]
    assert b["guarded"] == ["learned-k4-w1"] and b["explore"] == ["off", "ngram-k3-w1"]
    assert b["explore_p"][1] == pytest.approx(0.1 / 3)


def test_an_undersampled_arm_is_priced_by_its_cost_at_smaller_batches_and_by_its_few_samples():
    """Below ``min_samples_for_guard`` samples an arm's own estimate does not price its exploration; a
    pessimistic floor does: off / (estimate + guard_z * se) - 1 in a bucket of smaller batch sizes (drafts
    only get costlier as the batch grows) or from its few samples here; no evidence anywhere: full share."""
    cfg = BanditConfig(window=16, min_samples_for_guard=6, fast_guard_cost=1e9, explore_regret_budget=0.01)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM, LEARNED], cfg)
    feed(bandit, OFF, 6, 100, batch=4)
    feed(bandit, SUFFIX, 6, 40, batch=4)  # 6 samples at 0.4x off's rate in bucket 2 (batch 4..7)
    feed(bandit, OFF, 6, 100, batch=16)
    for arm in (SUFFIX, NGRAM, LEARNED):
        feed(bandit, arm, 1, 100, batch=16)  # one sample each in bucket 4: too few to price anything
    feed(bandit, LEARNED, 1, 30, batch=16)  # a second, slow sample: two are enough for the floor
    b = bandit.table()["buckets"][4]
    assert b["best"] == "off" and b["explore"] == ["suffix-k8-w1", "ngram-k3-w1", "learned-k4-w1"]
    share = 0.1 / 3
    se_suffix = 0.5 * 40 / math.sqrt(6)  # guard_cv_floor * R / sqrt(n): its steps are all alike
    c_suffix = 100 / (40 + 2.0 * se_suffix) - 1  # 0.78: at least that much slower than off at batch 16
    assert bandit._cost_floor(4, "suffix-k8-w1") == pytest.approx(c_suffix)
    assert bandit._cost_floor(4, "learned-k4-w1") == 0.0  # one of its two samples as fast as off
    assert b["explore_p"] == pytest.approx([0.01 / (3 * c_suffix), share, share])
    feed(bandit, LEARNED, 3, 30, batch=16)  # five samples, four slow ones: priced by its own floor
    c = bandit._cost_floor(4, "learned-k4-w1")
    assert c > 0.2
    assert bandit.table()["buckets"][4]["explore_p"][2] == pytest.approx(0.01 / (3 * c))
    assert bandit._cost_floor(1, "suffix-k8-w1") == 0.0  # nothing is known at batch 2..3 or below
    feed(bandit, NGRAM, 2, 20, batch=2)  # two samples at 0.2x off's rate, once off has 6 samples there
    assert bandit._cost_floor(1, "ngram-k3-w1") == 0.0
    feed(bandit, OFF, 6, 100, batch=2)
    floor = 100 / (20 + 2.0 * 0.5 * 20 / math.sqrt(2)) - 1
    assert bandit._cost_floor(1, "ngram-k3-w1") == pytest.approx(floor)
    assert bandit._cost_floor(4, "ngram-k3-w1") == pytest.approx(floor)  # holds at larger batch sizes


@pytest.mark.parametrize("where", ["bandit", "table_policy"])
def test_explore_regret_budget_sets_the_exploration_frequency(where):
    """The central bandit and a rollout actor's TablePolicy explore each arm at its ``explore_p``: counts
    over 40,000 steps within 5 binomial standard deviations; the unbudgeted bandit explores ~epsilon."""
    n = 40_000
    bandit = _three_arm_bandit(100, 200, 0.01)
    p = dict(zip(["off", "ngram-k3-w1"], bandit.table()["buckets"][0]["explore_p"]))
    if where == "bandit":
        picks = [bandit.choose(1).name for _ in range(n)]
    else:
        policy = TablePolicy(bandit.table(), seed=5)
        picks = [policy.choose(1).name for _ in range(n)]
    for name, q in p.items():
        k = picks.count(name)
        assert abs(k - n * q) <= 5 * math.sqrt(n * q * (1 - q)) + 1, (name, k, n * q)
    plain = _three_arm_bandit(100, 200, None)
    k = sum(plain.choose(1).name != "suffix-k8-w1" for _ in range(n))
    assert abs(k - 0.1 * n) <= 5 * math.sqrt(n * 0.09)
    assert k > 5 * sum(picks.count(x) for x in p)  # the budget cut exploration several-fold here


def test_an_arm_guarded_at_a_small_batch_is_not_probed_at_larger_ones():
    cfg = BanditConfig(window=8, min_samples_for_guard=4, guard_regret_budget=1.0, fast_guard_cost=1e9)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    feed(bandit, OFF, 4, 100, batch=4)
    feed(bandit, SUFFIX, 4, 40, batch=4)  # reliably below off at batch 4..7 (bucket 2)
    assert bandit.is_guarded(4, SUFFIX)
    probes = {b["bucket"]: b["probe"] for b in bandit.table()["buckets"]}
    assert probes[3] == probes[6] == ["off", "ngram-k3-w1"]  # batch 8.., 64..: not probed above
    assert probes[1] == ["off", "suffix-k8-w1", "ngram-k3-w1"]  # batch 2..3: smaller, still probed
    assert [bandit.choose(16).name for _ in range(2)] == ["off", "ngram-k3-w1"]
    # once the guard at batch 4 lifts (off's window turns over) it is probed at the larger sizes again
    feed(bandit, OFF, 8, 100, batch=4)
    assert not bandit.is_guarded(4, SUFFIX)
    assert "suffix-k8-w1" in bandit.table()["buckets"][6]["probe"]


def test_a_table_builds_where_drafting_arms_have_samples_and_off_has_none():
    # evidence merged from elsewhere can hold a few samples of other arms in a bucket off was never played
    # in; the table used to fail on off's empty window (no reference to price exploration by)
    cfg = BanditConfig(window=8, min_samples_for_guard=4, min_samples_for_best=4)
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], cfg)
    feed(bandit, SUFFIX, 2, 100, batch=16)
    feed(bandit, NGRAM, 3, 50, batch=16)
    b = bandit.table()["buckets"][bandit.bucket_of(16)]
    assert b["best"] == "off"  # too few samples to displace it
    assert b["probe"] == ["off", "suffix-k8-w1", "ngram-k3-w1"]  # off first, then the under-sampled arms
    assert b["explore"] == ["suffix-k8-w1", "ngram-k3-w1"]
    assert b["explore_p"] == [cfg.epsilon / 2] * 2  # no reference to price by: the full share


def test_table_policy_fast_path_records_what_the_slow_path_records():
    """Batch sizes whose bucket is settled on off take the fast path (``choose`` is a dict lookup, ``observe``
    only records); the records are those of the slow path, and a new table that gives the bucket an arm to
    probe ends the fast path at once."""
    table = _trained_bandit().table()
    for b in table["buckets"]:
        b.update(best="off", explore=[], explore_p=[], probe=[])
    fast = TablePolicy(table, seed=0)
    for b in (64, 64, 3, 64):
        fast.observe(b, fast.choose(b), float(b), 0.01)
    assert set(fast._fast) == {3, 64}
    slow = TablePolicy(table, seed=0)
    for b in (64, 64, 3, 64):
        slow.choose(b)
        slow._last = (b, slow.bucket_of(b), "off", False)  # as the slow path leaves it
        slow.observe(b, slow.arms["off"], float(b), 0.01)
    assert fast.drain_observations() == slow.drain_observations()
    # an off step reported as a string, or for another batch size than chosen, takes the slow path
    fast.choose(64)
    fast.observe(64, "off", 64.0, 0.01)
    fast.choose(64)
    fast.observe(63, fast.arms["off"], 63.0, 0.01)
    assert [o["batch_size"] for o in fast.drain_observations()] == [64, 63]
    table["buckets"][6]["probe"] = ["suffix-k8-w1"]
    fast.update(table)
    assert fast._fast == {} and fast.choose(64).name == "suffix-k8-w1"
