"""The central bandit (``services/tuner/bandit.py``) through its public API: ``observe`` / ``merge``, ``table``,
``stats``, ``state_dict`` / ``load_state_dict``, and its config."""

from __future__ import annotations

import json
import random

import pytest

from services.common.config import ConfigError, load_config
from services.tuner.arms import OFF, Arm, Drafter, TunerConfigError
from services.tuner.bandit import BanditConfig, BucketedBandit

FAST = Arm(Drafter.SUFFIX, 4)  # twice off's throughput at batch 1
SLOW = Arm(Drafter.NGRAM, 3)  # half of it
EVEN = Arm(Drafter.LEARNED, 2)  # as fast as off
ARMS = [OFF, FAST, SLOW, EVEN]


def feed(bandit, arm, n, tokens, seconds, b=1, seed=0, steps=1, explored=False):
    rng = random.Random(seed)
    for _ in range(n):
        s = seconds * (1 + 0.05 * rng.uniform(-1, 1))
        bandit.observe(b, arm, tokens, s, steps=steps, explored=explored)


def row(bandit, b=1):
    return bandit.table()["buckets"][bandit.bucket_of(b)]


def test_config_rejects_unknown_keys_and_bad_values_naming_them():
    with pytest.raises(TunerConfigError, match=r"unknown key\(s\) \['epsilon'\]"):
        BanditConfig.from_dict({"epsilon": 0.1}, "cfg")
    with pytest.raises(TunerConfigError, match="tuner.bandit.regret_budget"):
        BanditConfig.from_dict({"regret_budget": 2.0})
    with pytest.raises(TunerConfigError, match="tuner.bandit.bucket_edges"):
        BanditConfig(bucket_edges=[4, 2])
    with pytest.raises(
        ConfigError, match=r"^config: tuner.bandit: unknown key\(s\) \['guard_z'\]; allowed: \["
    ):
        load_config(None, ["tuner.bandit.guard_z=2"])  # a removed setting fails clearly
    cfg = BanditConfig.from_dict({"window": 16, "bucket_edges": [1, 8]})
    assert (cfg.window, cfg.bucket_edges, cfg.min_samples) == (16, [1, 8], BanditConfig().min_samples)


def test_off_is_best_until_an_arm_is_reliably_faster_and_untried_arms_are_probed_first():
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4))
    r = row(bandit)
    assert r["best"] == "off" and r["probe"] == [FAST.name, SLOW.name, EVEN.name] and not r["explore"]
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, EVEN, 2, 1, 0.010)
    r = row(bandit)
    assert r["probe"] == [FAST.name, SLOW.name, EVEN.name]  # the fewest samples first
    feed(bandit, FAST, 3, 2, 0.010)
    assert row(bandit)["best"] == "off"  # three samples: no estimate yet
    feed(bandit, FAST, 1, 2, 0.010)
    r = row(bandit)
    assert r["best"] == FAST.name and "off" in r["explore"] and FAST.name not in r["explore"]
    feed(bandit, EVEN, 6, 1, 0.010, seed=1)
    assert EVEN.name in row(bandit)["explore"]  # neither reliably faster nor slower: kept exploring
    # a bucket without drafting evidence plays off until off has its estimate there (an arm cannot be judged
    # against off without it), then the nearest bucket's best; off's evidence alone does not change that; the
    # arm's own evidence there decides
    r64 = row(bandit, 64)
    assert r64["best"] == "off" and FAST.name in r64["probe"] and not r64["windows"]
    feed(bandit, OFF, 3, 64, 0.010, b=64)
    assert row(bandit, 64)["best"] == "off"  # three samples: no estimate yet
    feed(bandit, OFF, 1, 64, 0.010, b=64)
    r64 = row(bandit, 64)
    assert r64["best"] == FAST.name and "off" not in r64["probe"] and FAST.name not in r64["probe"]
    assert bandit.stats()["buckets"][bandit.bucket_of(64)]["best"] == FAST.name  # the best it plays
    feed(bandit, FAST, 4, 32, 0.010, b=64)  # half off's throughput at batch 64
    r64 = row(bandit, 64)
    assert r64["best"] == "off" and FAST.name in r64["guarded"]  # buckets are judged independently


def test_of_the_arms_faster_than_off_the_best_has_the_highest_lower_bound_not_the_highest_rate():
    # FAST: 64 steps at 2 tokens per 10 ms. EVEN: 5 steps at 2.2 per 10 ms on average, from 1.2 to 3.2 (a few
    # steps, mostly taken when a selector judged it faster): the higher rate, but not reliably above FAST's
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4))
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, FAST, 64, 2, 0.010)
    for tokens in (1.2, 3.2, 2.2, 1.7, 2.7):
        bandit.observe(1, EVEN, tokens, 0.010)
    r = row(bandit)
    rate = {n: w[1] / w[2] for n, w in r["windows"].items()}  # sums: [n, tokens, seconds, ...]
    assert rate[EVEN.name] > 1.05 * rate[FAST.name] > 2 * rate["off"]
    assert r["best"] == FAST.name and EVEN.name in r["explore"]
    feed(bandit, EVEN, 60, 2.2, 0.010, seed=3)  # now as well measured: the higher rate wins
    assert row(bandit)["best"] == EVEN.name


def test_a_reliably_slower_arm_is_banned_and_reprobed_with_exponential_back_off():
    cfg = BanditConfig(min_samples=4, ban_steps=100)
    bandit = BucketedBandit(ARMS, cfg)
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, SLOW, 4, 1, 0.020)
    assert SLOW.name in row(bandit)["guarded"]
    for ban in (100, 200, 400):
        feed(bandit, OFF, 1, 1, 0.010, steps=ban - 1)
        r = row(bandit)
        assert SLOW.name in r["guarded"] and SLOW.name not in r["probe"] + r["explore"]
        feed(bandit, OFF, 1, 1, 0.010)
        r = row(bandit)
        assert SLOW.name not in r["guarded"] and SLOW.name in r["probe"]  # re-probed afresh
        feed(bandit, SLOW, 4, 1, 0.020, seed=ban)
        assert SLOW.name in row(bandit)["guarded"]  # slow again: the next ban lasts twice as long
    strikes = bandit.stats()["buckets"][0]["arms"][SLOW.name]["strikes"]
    assert strikes == 4


def test_merge_takes_many_actors_observations_and_counts_the_steps_they_carry():
    bandit = BucketedBandit(ARMS, BanditConfig())
    one = [dict(batch_size=1, arm="off", committed_tokens=1, seconds=0.01, steps=3)] * 4
    two = [dict(batch_size=40, arm=FAST.name, committed_tokens=80, seconds=0.05, explored=True)] * 2
    two += [dict(batch_size=40, arm="nope", committed_tokens=1, seconds=0.01)]
    assert bandit.merge(one + two) == 6
    st = bandit.stats()
    b1, b40 = st["buckets"][0], st["buckets"][bandit.bucket_of(40)]
    assert b1["observations"] == 12 and b1["arms"]["off"]["n"] == 4 and b1["arms"]["off"]["total"] == 12
    assert b40["arms"][FAST.name]["explored"] == 2 and st["dropped"] == 1
    assert b1["arms"]["off"]["ratio"] == pytest.approx(100.0)


def test_state_round_trips_through_json_and_rejects_other_bucket_edges():
    bandit = BucketedBandit(ARMS, BanditConfig(ban_steps=50))
    feed(bandit, OFF, 10, 1, 0.010)
    feed(bandit, SLOW, 4, 1, 0.030)
    feed(bandit, FAST, 5, 2, 0.010, b=40)
    state = json.loads(json.dumps(bandit.state_dict()))
    again = BucketedBandit(ARMS, BanditConfig(ban_steps=50))
    again.load_state_dict(state)
    assert again.stats() == bandit.stats()
    assert again.table()["buckets"] == bandit.table()["buckets"]
    feed(bandit, OFF, 1, 1, 0.010, steps=50)
    feed(again, OFF, 1, 1, 0.010, steps=50)
    assert SLOW.name in row(again)["probe"] and again.table()["buckets"] == bandit.table()["buckets"]
    with pytest.raises(TunerConfigError, match="bucket_edges"):
        BucketedBandit(ARMS, BanditConfig(bucket_edges=[1, 8])).load_state_dict(state)
    with pytest.raises(TunerConfigError, match="format"):
        again.load_state_dict({**state, "format": 1})


def test_reset_arms_forgets_a_drafters_evidence_only():
    bandit = BucketedBandit(ARMS, BanditConfig())
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, EVEN, 8, 1, 0.010)
    feed(bandit, FAST, 8, 2, 0.010)
    assert bandit.reset_arms(["learned", "hybrid"]) == 1
    arms = bandit.stats()["buckets"][0]["arms"]
    assert arms[EVEN.name]["total"] == 0 and arms[FAST.name]["total"] == 8
    assert EVEN.name in row(bandit)["probe"] and FAST.name not in row(bandit)["probe"]


def test_a_drafting_arms_records_older_than_the_horizon_are_forgotten_and_it_is_probed_again():
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4, horizon=100))
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, FAST, 4, 2, 0.010)
    assert row(bandit)["best"] == FAST.name
    feed(bandit, OFF, 60, 1, 0.010)  # FAST's records are 60 bucket steps old: still within the horizon
    assert row(bandit)["best"] == FAST.name
    feed(bandit, OFF, 60, 1, 0.010)  # now 120: forgotten, FAST is probed afresh; off keeps its window
    r = row(bandit)
    assert r["best"] == "off" and FAST.name in r["probe"] and "off" in r["windows"]
    assert bandit.state_dict()["buckets"][0]["arms"][FAST.name]["window"] == []
    feed(bandit, FAST, 4, 2, 0.010)
    assert row(bandit)["best"] == FAST.name


def test_a_rarely_played_buckets_records_age_with_the_steps_of_every_bucket_and_its_bans_with_its_own():
    # early in training FAST lost at batch 1 (banned) and SLOW's records there are old; then batch 64 is played
    # for many steps while batch 1 sees none: SLOW's records expire on the bandit's clock, FAST's ban waits for
    # batch 1's own steps
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4, ban_steps=50, horizon=100))
    feed(bandit, OFF, 8, 1, 0.010)
    feed(bandit, FAST, 4, 1, 0.020)
    feed(bandit, SLOW, 4, 1, 0.010)
    r = row(bandit)
    assert FAST.name in r["guarded"] and SLOW.name in r["windows"] and r["best"] == "off"
    feed(bandit, OFF, 4, 64, 0.010, b=64)
    feed(bandit, FAST, 40, 128, 0.010, b=64)  # FAST wins at batch 64
    assert row(bandit, 64)["best"] == FAST.name
    assert SLOW.name in row(bandit)["windows"]  # 48 steps later: still within the horizon
    feed(bandit, FAST, 60, 128, 0.010, b=64)
    r = row(bandit)  # 108 steps later: SLOW's records expired, off's stay; FAST's ban has not seen a step
    assert SLOW.name in r["probe"] and SLOW.name not in r["windows"] and "off" in r["windows"]
    assert FAST.name in r["guarded"] and r["best"] == "off"
    feed(bandit, OFF, 50, 1, 0.010)
    r = row(bandit)
    assert FAST.name not in r["guarded"] and FAST.name in r["probe"]
    feed(bandit, FAST, 4, 2, 0.010)
    assert row(bandit)["best"] == FAST.name


def test_the_regret_allowance_grows_with_the_buckets_time_and_shrinks_by_explorations_extra_time():
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4, regret_budget=0.1))
    feed(bandit, SLOW, 2, 1, 0.020, explored=True)  # before off has an estimate: not charged
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 0.04, abs=1.2e-3)
    feed(bandit, OFF, 10, 1, 0.010)  # 100 tokens/s; ten steps of 10 ms
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 0.14, abs=1.2e-3)
    bandit.observe(1, EVEN, 1, 0.030, explored=True)  # 20 ms more than off's for its one token
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 0.17 - 0.020, abs=1.2e-3)
    bandit.observe(1, OFF, 1, 0.010, steps=64)  # a leased sample stands for 64 steps of its seconds
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 0.81 - 0.020, abs=1.2e-3)
    bandit.observe(1, FAST, 2, 0.010, explored=True)  # quicker than off: costs nothing
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 0.82 - 0.020, abs=1.2e-3)
    bandit.observe(1, OFF, 0, 0.0, steps=100)  # untimed (a lease without a sample): off's mean step each
    assert row(bandit)["allowance"] == pytest.approx(0.1 * 1.82 - 0.020, abs=1.2e-3)
    assert row(bandit, 64)["allowance"] == 0.0  # per bucket
