"""Checkpoint / restore and merging of bandit state (a central tuner fed by several actors)."""

import json
import random

import pytest

from services.tuner.arms import OFF, Arm, TunerConfigError, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
from services.tuner.sim import ArmProfile, CostModel

PROFILES = {
    "suffix-k4-w1": ArmProfile(alpha=0.72, draft_ms_per_request=0.02),
    "learned-k16-w2-d8": ArmProfile(alpha=0.70, draft_ms_per_level=1.0),
    "hybrid-k16-w1": ArmProfile(alpha=0.10, draft_ms_per_level=0.6),
}
ARMS = parse_arms(["off", *PROFILES])
MODEL = CostModel(profiles=PROFILES)


def drive(bandit, steps, seed):
    rng = random.Random(seed)
    choices = []
    for _ in range(steps):
        b = rng.choice([1, 2, 9, 40, 80])
        arm = bandit.choose(b)
        tok, sec = MODEL.sample(arm, b, rng)
        bandit.observe(b, arm, tok, sec)
        choices.append(arm.name)
    return choices


def test_state_round_trip_through_json():
    a = BucketedBandit(ARMS, BanditConfig(seed=7, window=16))
    drive(a, 1500, seed=1)
    a.table()
    state = json.loads(json.dumps(a.state_dict()))  # JSON-serializable
    b = BucketedBandit(ARMS, BanditConfig(seed=999, window=16))
    b.load_state_dict(state)
    assert b.stats() == a.stats()
    assert b.table() == a.table()
    sa, sb = a.state_dict(), b.state_dict()
    assert sb.pop("config")["seed"] == 999  # the loading bandit's config wins ...
    sa.pop("config")
    assert sb == sa  # ... everything else is restored
    assert any(arm["guarded"] for bucket in a.stats()["buckets"] for arm in bucket["arms"].values())
    # the RNG is restored too: both continue identically
    assert drive(a, 500, seed=2) == drive(b, 500, seed=2)
    assert b.stats() == a.stats()


def test_load_with_a_changed_arm_list():
    a = BucketedBandit(ARMS, BanditConfig(seed=0))
    drive(a, 500, seed=1)
    extra = Arm.from_name("ngram-k3-w1")
    b = BucketedBandit([OFF, Arm.from_name("suffix-k4-w1"), extra], BanditConfig(seed=0))
    b.load_state_dict(a.state_dict())
    sa, sb = a.stats()["buckets"][0]["arms"], b.stats()["buckets"][0]["arms"]
    assert sb["suffix-k4-w1"] == sa["suffix-k4-w1"]
    assert sb["ngram-k3-w1"]["n"] == 0  # new arm: untried
    assert "hybrid-k16-w1" not in sb  # dropped arm: ignored
    assert b.choose(1) == extra  # untried first


def test_incompatible_state_is_rejected_clearly():
    a = BucketedBandit(ARMS, BanditConfig(bucket_edges=[1, 8, 64]))
    b = BucketedBandit(ARMS)
    with pytest.raises(TunerConfigError, match="bucket_edges"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(TunerConfigError, match="bucket_edges"):
        b.merge(a.state_dict())
    bad = b.state_dict()
    bad["format"] = 99
    with pytest.raises(TunerConfigError, match="format"):
        b.load_state_dict(bad)


def test_merge_states_of_two_actors():
    a = BucketedBandit(ARMS, BanditConfig(seed=1))
    b = BucketedBandit(ARMS, BanditConfig(seed=2))
    drive(a, 800, seed=10)
    drive(b, 800, seed=20)
    merged = BucketedBandit(ARMS, BanditConfig(seed=3))
    merged.load_state_dict(a.state_dict())
    taken = merged.merge(b.state_dict())
    sa, sb, sm = a.stats(), b.stats(), merged.stats()
    assert taken == sum(arm["n"] for bucket in sb["buckets"] for arm in bucket["arms"].values())
    assert sm["chosen"] == sa["chosen"] + sb["chosen"]
    for ba, bb, bm in zip(sa["buckets"], sb["buckets"], sm["buckets"]):
        assert bm["observations"] == ba["observations"] + bb["observations"]
        for name in bm["arms"]:
            assert bm["arms"][name]["total"] == ba["arms"][name]["total"] + bb["arms"][name]["total"]
            cap = merged.cfg.off_maxlen if name == "off" else merged.cfg.window  # off keeps a longer window
            assert bm["arms"][name]["n"] == min(cap, ba["arms"][name]["n"] + bb["arms"][name]["n"])
    # the merged evidence still says: deep drafts at batch 1, off at batch 80, the bad arm guarded there
    best = merged.best_arms()
    assert best[merged.bucket_of(1)] == "learned-k16-w2-d8"
    assert best[merged.bucket_of(80)] == "off"
    assert merged.is_guarded(80, "hybrid-k16-w1")


def test_merge_observation_list_equals_observing_one_by_one():
    central = BucketedBandit(ARMS, BanditConfig(seed=0))
    drive(central, 300, seed=3)
    replica = BucketedBandit(ARMS, BanditConfig(seed=0))
    replica.load_state_dict(central.state_dict())
    policy = TablePolicy(central.table(), seed=4)
    rng = random.Random(4)
    for _ in range(400):
        b = rng.choice([1, 9, 80])
        arm = policy.choose(b)
        tok, sec = MODEL.sample(arm, b, rng)
        policy.observe(b, arm, tok, sec)
    obs = policy.drain_observations()
    assert central.merge(obs) == 400
    for o in obs:
        replica.observe(
            o["batch_size"], o["arm"], o["committed_tokens"], o["seconds"], explored=o["explored"]
        )
    assert central.stats() == replica.stats()
    assert central.state_dict()["buckets"] == replica.state_dict()["buckets"]
