"""The bandit's default estimate (stall-capped throughput) and the rollout policy's step clock.

- A drafting arm's per-step rewards are skewed: most steps commit one token per request at a little more
  than off's cost, a few commit many. Its throughput can beat off's while its typical (median) step loses;
  the default estimate ranks by throughput, the median estimator does not.
- One stalled step (GC pause, a preempted core) counts as at most ``stall_cap`` typical steps, so it cannot
  flip the ranking as it does for the plain ratio.
- ``TunedStrategyPolicy`` reports the decoding thread's CPU time (``clock="thread"``), the engine's wall time
  (``"engine"``), or picks one (``"auto"``: thread CPU time without CUDA).
"""

from __future__ import annotations

import time

import pytest

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import StepObservation
from services.tuner.arms import OFF, Arm, TunerConfigError
from services.tuner.bandit import BanditConfig, BucketedBandit
from services.tuner.policy import TunedStrategyPolicy, resolve_clock

SUFFIX = Arm.from_name("suffix-k8-w1")


def skewed_drafting_steps(bandit: BucketedBandit, n: int = 40) -> None:
    """Off: 1 token in 10 ms (100 tokens/s). Suffix: 7 of 8 steps 1 token in 12 ms (83/s), 1 of 8 steps
    5 tokens in 13 ms (385/s): 12 tokens in 97 ms per 8 steps = 124 tokens/s, 1.24x off's throughput."""
    for i in range(n):
        bandit.observe(1, OFF, 1, 0.010)
        if i % 8 == 7:
            bandit.observe(1, SUFFIX, 5, 0.013)
        else:
            bandit.observe(1, SUFFIX, 1, 0.012)


def test_default_estimate_is_throughput_and_ranks_a_skewed_drafting_arm_first():
    assert BanditConfig().estimator == "capped"
    capped = BucketedBandit([OFF, SUFFIX], BanditConfig(epsilon=0.0))
    median = BucketedBandit([OFF, SUFFIX], BanditConfig(epsilon=0.0, estimator="median"))
    for b in (capped, median):
        skewed_drafting_steps(b)
    assert capped.estimate(1, SUFFIX) == pytest.approx(12 / 0.097)
    assert capped.estimate(1, OFF) == pytest.approx(100.0)
    assert capped.best_arms()[0] == "suffix-k8-w1"
    assert not capped.is_guarded(1, SUFFIX)
    # the median sees the typical step (83/s < 100/s) and keeps the slower arm
    assert median.estimate(1, SUFFIX) == pytest.approx(1 / 0.012)
    assert median.best_arms()[0] == "off"
    stats = capped.stats()["buckets"][0]["arms"]["suffix-k8-w1"]
    assert stats["estimate"] == pytest.approx(12 / 0.097) and stats["median"] == pytest.approx(1 / 0.012)


def test_a_stall_counts_as_at_most_stall_cap_typical_steps():
    capped = BucketedBandit([OFF, SUFFIX], BanditConfig(epsilon=0.0, min_samples_for_guard=10**6))
    ratio = BucketedBandit(
        [OFF, SUFFIX], BanditConfig(epsilon=0.0, estimator="ratio", min_samples_for_guard=10**6)
    )
    for b in (capped, ratio):
        for _ in range(20):
            b.observe(1, OFF, 1, 0.010)
            b.observe(1, SUFFIX, 1.2, 0.010)
        b.observe(1, SUFFIX, 1, 1.0)  # one step stalled for a second (100 typical steps)
    # the stall is capped at 2 x the median step (20 ms): 25 tokens in 0.22 s
    assert capped.estimate(1, SUFFIX) == pytest.approx(25.0 / 0.22)
    assert capped.best_arms()[0] == "suffix-k8-w1"
    assert ratio.estimate(1, SUFFIX) == pytest.approx(25.0 / 1.2)
    assert ratio.best_arms()[0] == "off"


def test_stall_cap_validation_and_state_round_trip():
    with pytest.raises(TunerConfigError, match="stall_cap"):
        BanditConfig(stall_cap=0.5)
    a = BucketedBandit([OFF, SUFFIX], BanditConfig(stall_cap=4.0))
    skewed_drafting_steps(a, 16)
    b = BucketedBandit([OFF, SUFFIX], BanditConfig(stall_cap=4.0))
    b.load_state_dict(a.state_dict())
    assert b.estimate(1, SUFFIX) == pytest.approx(a.estimate(1, SUFFIX))
    assert b.cfg.stall_cap == 4.0


# ---------------------------------------------------------------------------------------------- clock
def _table(arm: str) -> dict:
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(epsilon=0.0))
    for _ in range(8):
        bandit.observe(1, OFF, 1, 0.01)
        bandit.observe(1, SUFFIX, 3 if arm == "suffix-k8-w1" else 0.5, 0.01)
    table = bandit.table()
    assert table["buckets"][0]["best"] == arm
    return table


def _step(policy: TunedStrategyPolicy, work) -> dict:
    req = DraftRequest("r0", "p0", [1, 2, 3], 2, None)
    policy.choose([req])
    work()
    policy.observe(StepObservation(1, "off", 1, 0, 0, 0.25))  # the engine says: 250 ms of wall time
    (ob,) = policy.drain_observations()
    return ob


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_thread_clock_reports_cpu_time_not_waiting():
    policy = TunedStrategyPolicy(_table("off"), clock="thread", sample_every=1)  # every step a sample
    assert policy.clock == "thread"
    waited = _step(policy, lambda: time.sleep(0.05))  # no CPU: a step that only waited for a core
    assert 0 < waited["seconds"] < 0.03
    busy = _step(policy, lambda: _burn(0.03))
    assert 0.03 <= busy["seconds"] < 0.25
    assert busy["arm"] == "off" and busy["committed_tokens"] == 1


def test_thread_clock_charges_a_chosen_step_its_choice_and_offs_sample_in_a_run_not(monkeypatch):
    """A step chosen in ``choose`` is timed from its start (choosing is part of playing it, as in the engine's
    wall time); off's sample in a quiet run from its end (off's quiet steps are played without choosing)."""
    import services.tuner.policy as policy_mod

    now = [100.0]
    monkeypatch.setattr(policy_mod.time, "thread_time", lambda: now[0])

    def tick(dt: float) -> None:
        now[0] += dt

    def seconds(arm: str, sample_every: int) -> float:
        policy = TunedStrategyPolicy(_table(arm), clock="thread", sample_every=sample_every)
        choose_run = policy.table.choose_run

        def slow_choice(*a):
            tick(0.003)  # the choice's own Python
            return choose_run(*a)

        monkeypatch.setattr(policy.table, "choose_run", slow_choice)
        obs = []
        for _ in range(5):  # with runs: decided, 3 quiet, sampled
            policy.choose([DraftRequest("r0", "p0", [1, 2, 3], 2, None)])
            tick(0.010)  # draft + verify + commit
            policy.observe(StepObservation(1, arm, 1, 0, 0, 0.25))
            obs += policy.drain_observations() if sample_every == 1 else []
        obs += policy.drain_observations()
        assert obs and {o["arm"] for o in obs} == {arm}
        return obs[-1]["seconds"]

    assert seconds("suffix-k8-w1", 1) == pytest.approx(0.013)
    assert seconds(OFF.name, 1) == pytest.approx(
        0.013
    )  # chosen at every step, as where a drafting arm is best
    assert seconds(OFF.name, 8) == pytest.approx(0.010)  # off's sample in a run: its steps are not chosen


def test_engine_clock_reports_the_engine_seconds():
    policy = TunedStrategyPolicy(_table("suffix-k8-w1"), clock="engine")
    ob = _step(policy, lambda: _burn(0.01))
    assert ob["seconds"] == 0.25 and ob["arm"] == "suffix-k8-w1"


def test_auto_clock_and_validation():
    import torch

    assert resolve_clock("auto") == ("engine" if torch.cuda.is_available() else "thread")
    assert TunedStrategyPolicy(_table("off")).clock == resolve_clock("auto")
    assert resolve_clock("engine") == "engine"
    with pytest.raises(TunerConfigError, match="clock"):
        TunedStrategyPolicy(_table("off"), clock="wall")


def test_throughput_guard_waits_longer_for_a_mildly_slower_arm():
    """Default guard: upper confidence bound of the throughput (standard error at least 0.5 R / sqrt(n)) below
    0.95 x off. An arm at half off's throughput is guarded after k samples; one at 0.8x after ~30."""
    cfg = BanditConfig(min_samples_for_guard=6, fast_guard_cost=1e9)
    half = BucketedBandit([OFF, SUFFIX], cfg)
    mild = BucketedBandit([OFF, SUFFIX], BanditConfig(**cfg.to_dict()))
    for b in (half, mild):
        for _ in range(6):
            b.observe(1, OFF, 1, 0.01)
    for i in range(6):
        half.observe(1, SUFFIX, 0.5, 0.01)
        assert half.is_guarded(1, SUFFIX) == (i == 5)
    n = 0
    while not mild.is_guarded(1, SUFFIX):
        mild.observe(1, SUFFIX, 0.8, 0.01)
        n += 1
    # 80 (1 + 2 * 0.5 / sqrt(n)) < 95  <=>  n > 28.4: steady rewards, so only the floor keeps it unguarded
    assert n == 29
    # the quantile rule guards both after k samples
    q = BucketedBandit([OFF, SUFFIX], BanditConfig(min_samples_for_guard=6, guard_rule="quantile"))
    for _ in range(6):
        q.observe(1, OFF, 1, 0.01)
        q.observe(1, SUFFIX, 0.8, 0.01)
    assert q.is_guarded(1, SUFFIX)


def test_an_arm_needs_min_samples_for_best_to_displace_off():
    """One lucky step (a long accept) does not make a drafting arm the table's best: arms with fewer than
    ``min_samples_for_best`` samples are probed (once per table version by a TablePolicy) and meanwhile off
    stays the greedy choice; with enough samples the estimate decides."""
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(epsilon=0.0, min_samples_for_best=4))
    bk = bandit.bucket_of(16)
    bandit.observe(16, OFF, 16, 0.010)
    bandit.observe(16, SUFFIX, 40, 0.012)  # 2.1x off's rate, once
    table = bandit.table()["buckets"][bk]
    assert table["best"] == "off" and table["probe"] == ["off", "suffix-k8-w1"]
    # the central bandit plays the under-sampled arms first, least played first
    picks = [bandit.choose(16).name for _ in range(6)]
    assert sorted(picks) == ["off"] * 3 + ["suffix-k8-w1"] * 3
    later = BucketedBandit([OFF, SUFFIX], BanditConfig(**bandit.cfg.to_dict()))
    later.load_state_dict(bandit.state_dict())
    for _ in range(3):
        bandit.observe(16, OFF, 16, 0.010)
        bandit.observe(16, SUFFIX, 16, 0.016)  # the long accept was luck: 0.63x off from now on
        later.observe(16, OFF, 16, 0.010)
        later.observe(16, SUFFIX, 24, 0.012)  # it keeps accepting: 1.25x off
    assert bandit.table()["buckets"][bk]["probe"] == []
    assert bandit.estimate(16, SUFFIX) < bandit.estimate(16, OFF)  # 88 tokens / 60 ms < 1600 / s
    assert bandit.best_arms()[bk] == "off"
    assert later.best_arms()[bk] == "suffix-k8-w1"


def test_off_keeps_a_longer_window_than_the_drafting_arms():
    """Off gets most steps, so its estimate spans ``off_window`` (8 x window) of them: a short slow stretch of
    off (a long response at batch 1) does not make an arm explored across many rollouts look faster."""
    cfg = BanditConfig(window=8, epsilon=0.0, min_samples_for_guard=10**6)
    assert cfg.off_maxlen == 64
    bandit = BucketedBandit([OFF, SUFFIX], cfg)
    for _ in range(56):
        bandit.observe(1, OFF, 1, 0.010)  # 100 tokens/s over many responses
    for _ in range(8):
        bandit.observe(1, SUFFIX, 1.1, 0.012)  # 92 tokens/s
        bandit.observe(1, OFF, 1, 0.0125)  # the current long response: 80 tokens/s
    st = bandit.stats()["buckets"][0]["arms"]
    assert st["off"]["n"] == 64 and st["suffix-k8-w1"]["n"] == 8
    assert bandit.estimate(1, OFF) == pytest.approx(64 / (56 * 0.010 + 8 * 0.0125))
    assert bandit.estimate(1, SUFFIX) < bandit.estimate(1, OFF)
    short = BucketedBandit([OFF, SUFFIX], BanditConfig(**{**cfg.to_dict(), "off_window": 8}))
    short.load_state_dict(bandit.state_dict())  # keeps off's newest 8: the slow stretch only
    assert short.estimate(1, OFF) == pytest.approx(80.0)
    assert short.estimate(1, SUFFIX) > short.estimate(1, OFF)  # the short slice would rank suffix first
