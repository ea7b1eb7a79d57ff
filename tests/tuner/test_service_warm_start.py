"""A run's tuner can start from an earlier run's checkpoint (``tuner.init_state``): the suffix / n-gram /
off evidence carries over, the learned drafter's arms start afresh, the run's own checkpoint wins on a
restart, and a missing or incompatible file fails with one error naming the key."""

import json
import random

import pytest

from services.common.config import ConfigError, load_config
from services.rollout_actor.speculative.base import DraftRequest
from services.tuner.arms import TunerConfigError, parse_arms
from services.tuner.selector import StrategySelector
from services.tuner.service import TunerService
from tests.tuner.sim import ArmProfile, CostModel

PROFILES = {
    "suffix-k4-w1": ArmProfile(alpha=0.72, draft_ms_per_request=0.02),
    "ngram-k3-w1": ArmProfile(alpha=0.0, draft_ms_per_level=3.0),
    "learned-k4-w1": ArmProfile(alpha=0.70, draft_ms_per_level=1.0),
}
ARMS = ["off", *PROFILES]
MODEL = CostModel(profiles=PROFILES)


def observations(n, seed):
    rng, arms = random.Random(seed), parse_arms(ARMS)
    out = []
    for _ in range(n):
        b, arm = rng.choice([1, 2, 40, 80]), rng.choice(arms)
        tok, sec = MODEL.sample(arm, b, rng)
        out.append(dict(batch_size=b, arm=arm.name, committed_tokens=tok, seconds=sec))
    return out


def arm_stats(svc):
    return {
        (b["bucket"], n): (a["n"], a["guarded"]) for b in svc.stats()["buckets"] for n, a in b["arms"].items()
    }


def second_run(tmp_path):
    """The second run's tuner: its own checkpoint path, and the first run's state as ``init_state``."""
    return TunerService(
        ARMS,
        {"ban_steps": 10**6},
        checkpoint_path=str(tmp_path / "run2" / "tuner_state.json"),
        init_state=str(tmp_path / "run1" / "tuner_state.json"),
    )


def test_a_new_run_starts_from_the_earlier_runs_evidence_but_not_its_learned_arms(tmp_path):
    first = TunerService(
        ARMS, {"ban_steps": 10**6}, checkpoint_path=str(tmp_path / "run1" / "tuner_state.json")
    )
    first.merge(observations(3000, seed=0))
    before = arm_stats(first)
    assert any(n > 0 for (_, name), (n, _) in before.items() if name.startswith("learned"))
    assert any(g for (_, name), (_, g) in before.items() if name == "ngram-k3-w1")  # slow arm guarded

    second = second_run(tmp_path)
    assert second.warm_started and not second.restored
    after = arm_stats(second)
    for (bucket, name), st in before.items():
        if name.startswith("learned"):
            assert after[(bucket, name)] == (0, False)  # a new head: probed afresh
        else:
            assert after[(bucket, name)] == st  # windows and guards carried over
    # the warm table already knows batch 1's faster arm: a rollout actor's selector plays it from its first step
    sel = StrategySelector(second.table(), clock="engine")
    assert [s.name for s in sel.choose([DraftRequest("r", "p", [1, 2], 1)])] == ["suffix-k4"]
    b80 = second.table()["buckets"][second.bandit.bucket_of(80)]
    assert "learned-k4-w1" in b80["probe"] and "off" not in b80["probe"]  # only the new head is probed
    assert "ngram-k3-w1" in b80["guarded"]

    # a restart of the second run resumes its own checkpoint, not init_state
    second.merge(observations(50, seed=3))
    again = second_run(tmp_path)
    assert again.restored and not again.warm_started
    assert arm_stats(again) == arm_stats(second)


def test_a_missing_or_incompatible_init_state_fails_naming_the_key(tmp_path):
    with pytest.raises(TunerConfigError, match="tuner.init_state: no such file"):
        TunerService(ARMS, init_state=str(tmp_path / "nope.json"))
    other = TunerService(ARMS, {"bucket_edges": [1, 8, 64]}, checkpoint_path=str(tmp_path / "o.json"))
    other.merge(observations(10, seed=0))
    with pytest.raises(TunerConfigError, match=r"tuner.init_state: cannot load .*bucket_edges"):
        TunerService(ARMS, init_state=str(tmp_path / "o.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="tuner.init_state: cannot load"):
        load_config(None, [f"tuner.init_state={tmp_path / 'bad.json'}"])
    with pytest.raises(ConfigError, match="tuner.init_state: no such file"):
        load_config(None, [f"tuner.init_state={tmp_path / 'nope.json'}"])
    cfg = load_config(None, [f"tuner.init_state={tmp_path / 'o.json'}", "tuner.bandit.bucket_edges=[1,8,64]"])
    assert cfg.tuner.init_state == str(tmp_path / "o.json")
    json.loads((tmp_path / "o.json").read_text())  # untouched by validation
