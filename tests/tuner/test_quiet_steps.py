"""Quiet steps (``TunedStrategyPolicy(sample_every=...)``, ``TablePolicy.quiet_run``): greedy off steps that
are certain ahead of time (a bucket settled on off; the gap before a bucket's next exploration, drawn at once)
are played without clock, table or record, at most ``sample_every - 1`` between two measured off steps, which
carry their count. Counts stay exact (choices at every drain, observations once carried), the exploration law
and the regret ledger's bound are kept."""

import math

import pytest

import services.tuner.policy as policy_mod
from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import Lease, LeaseSample, StepObservation
from services.tuner.arms import OFF, Arm, TunerConfigError
from services.tuner.bandit import BanditConfig, BucketedBandit
from services.tuner.grpc_service import observation_from_pb, observation_to_pb
from services.tuner.policy import TunedStrategyPolicy

SUFFIX = Arm.from_name("suffix-k8-w1")


def table(explore=(), edges=(1, 4)) -> dict:
    """A table whose buckets' best is off; ``explore`` (with p = 1) in the first bucket only."""
    buckets = []
    for i, lo in enumerate(edges):
        buckets.append(
            {
                "bucket": i,
                "lo": lo,
                "hi": None,
                "best": OFF.name,
                "explore": list(explore) if i == 0 else [],
                "explore_p": [1.0 / len(explore)] * len(explore) if explore and i == 0 else [],
                "probe": [],
                "guarded": [],
                "off_estimate": None,
            }
        )
    return {
        "version": 1,
        "epsilon": 0.1,
        "bucket_edges": list(edges),
        "arms": {a.name: a.to_dict() for a in (OFF, SUFFIX)},
        "buckets": buckets,
        "ledger": None,
    }


def step(policy: TunedStrategyPolicy, b: int) -> str:
    """One decode step at batch size ``b`` (the engine's calls); returns the strategy played."""
    reqs = [DraftRequest(f"r{i}", "p0", [1, 2, 3], 2, None) for i in range(b)]
    strategies = policy.choose(reqs)
    policy.observe(StepObservation(b, strategies[0].name, b, 0, 0, 0.002))
    return strategies[0].name


@pytest.fixture
def clock_reads(monkeypatch):
    """Counts the policy's reads of the thread clock."""
    calls = [0]
    real = policy_mod.time.thread_time

    def counted():
        calls[0] += 1
        return real()

    monkeypatch.setattr(policy_mod.time, "thread_time", counted)
    return calls


def test_settled_off_buckets_measure_one_step_in_k_and_count_every_step(clock_reads):
    policy = TunedStrategyPolicy(table(), clock="thread", sample_every=8, run_samples=4)
    for _ in range(100):
        assert step(policy, 1) == OFF.name
    for _ in range(37):
        step(policy, 5)
    # decided (a run of 4 * 8 - 1 quiet steps starts, no clock): steps 1, 33, 65, 97 at batch 1 and 1, 33 at
    # batch 5; off's samples are the runs' steps after their first 3 quiet ones and every 8th after that, 5, 13,
    # ..., 93 (12; the run decided at 97 ends before its sample) and 5, 13, ..., 37 (5): two clock reads each,
    # and one per decision (6)
    assert clock_reads[0] == 2 * (12 + 5) + (4 + 2)
    assert policy.drain_choices() == {OFF.name: 137}  # quiet steps counted exactly
    obs = policy.drain_observations()
    assert len(obs) == 17
    assert all(o["arm"] == OFF.name and o["seconds"] > 0 for o in obs)
    by_b = {b: [o["steps"] for o in obs if o["batch_size"] == b] for b in (1, 5)}
    # the first sample stands for itself and the steps before it, the step that decided its run included; each
    # later one for the 8 steps since the previous one; the steps after the last sample (94-100 at batch 1)
    # ride on the next
    assert by_b[1] == [5] + [8] * 11 and by_b[5] == [5] + [8] * 4
    for b in [1] * 5 + [5] * 5:  # a decision (the drain ended the runs), 3 quiet steps and a sample in each
        step(policy, b)
    assert [(o["batch_size"], o["steps"]) for o in policy.drain_observations()] == [(1, 7 + 5), (5, 5)]
    assert policy.drain_choices() == {OFF.name: 10}
    # the tuner counts every step it was told of: 93 + 1 at batch 1 (bucket 0), 37 at batch 5 (bucket 1)
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(bucket_edges=[1, 4]))
    bandit.merge(
        obs + [{"batch_size": 1, "arm": "off", "committed_tokens": 1.0, "seconds": 0.002, "steps": 1}]
    )
    stats = bandit.stats()["buckets"]
    assert stats[0]["observations"] == 93 + 1 and stats[1]["observations"] == 37
    assert stats[0]["arms"]["off"]["n"] == 13 and stats[0]["arms"]["off"]["chosen"] == 94


def test_sample_every_one_measures_every_step(clock_reads):
    policy = TunedStrategyPolicy(table(), clock="thread", sample_every=1)
    for _ in range(20):
        step(policy, 1)
    assert clock_reads[0] == 40
    obs = policy.drain_observations()
    assert len(obs) == 20 and {o["steps"] for o in obs} == {1}


def test_explored_steps_are_measured_and_quiet_steps_ride_on_off_only(clock_reads):
    policy = TunedStrategyPolicy(table(), clock="thread", sample_every=8)
    for _ in range(12):  # decided: 1 and 9; sampled: 5 (the second run's sample, 13, is not reached)
        step(policy, 1)
    # a table that explores the suffix arm at batch 1 with p = 1: every step there is measured
    policy.update_table(table(explore=[SUFFIX.name]))
    reads = clock_reads[0]
    for _ in range(6):
        assert step(policy, 1) != OFF.name
    assert clock_reads[0] - reads == 12
    assert policy.drain_choices() == {OFF.name: 12, SUFFIX.name: 6}
    obs = policy.drain_observations()
    assert [(o["arm"], o["steps"]) for o in obs] == [(OFF.name, 5)] + [(SUFFIX.name, 1)] * 6
    assert all(o["explored"] for o in obs[1:])
    # back to an all-off table: the 7 off steps since the sample (3, the second decision, 3 quiet) ride on the
    # next off sample, the fifth step of the next run
    policy.update_table(table())
    for _ in range(5):
        step(policy, 1)
    ((ob),) = policy.drain_observations()
    assert ob["arm"] == OFF.name and ob["steps"] == 7 + 5


def test_a_table_update_mid_countdown_keeps_counts_exact():
    policy = TunedStrategyPolicy(table(), clock="engine", sample_every=8)
    for _ in range(4):  # decided, 3 quiet of a run of 7 (its sample not reached)
        step(policy, 1)
    policy.update_table(table())
    assert policy.drain_choices() == {OFF.name: 4}
    # decided, 3 quiet, sampled (carrying 4 + 5), 3 quiet, decided, 3 quiet, sampled (carrying 8), 1 quiet
    for _ in range(14):
        step(policy, 1)
    assert policy.drain_choices() == {OFF.name: 14}
    steps = [o["steps"] for o in policy.drain_observations()]
    assert steps == [9, 8]
    assert sum(steps) == 4 + 14 - 1  # the last step rides on the next sample


def test_steps_survive_the_grpc_round_trip_and_are_validated():
    ob = {
        "batch_size": 3,
        "arm": "off",
        "committed_tokens": 3.0,
        "seconds": 0.01,
        "explored": False,
        "steps": 8,
    }
    assert observation_from_pb(observation_to_pb(ob))["steps"] == 8
    no_steps = {k: v for k, v in ob.items() if k != "steps"}
    assert observation_from_pb(observation_to_pb(no_steps))["steps"] == 1
    bandit = BucketedBandit([OFF, SUFFIX])
    with pytest.raises(ValueError, match="steps"):
        bandit.observe(1, OFF, 1.0, 0.01, steps=0)
    with pytest.raises(TunerConfigError, match="sample_every"):
        TunedStrategyPolicy(table(), sample_every=0)


def test_guard_holds_count_off_steps_whether_reported_one_by_one_or_carried():
    """A guarded arm's hold is counted in off steps: quiet steps carried by a record count as much as steps
    reported one by one, so the hold lifts after the same number of off steps either way."""

    def lifted_after(steps_per_record: int) -> int:
        bandit = BucketedBandit(
            [OFF, SUFFIX], BanditConfig(epsilon=0.0, guard_hold=40, guard_max_hold=10_000)
        )
        for _ in range(10):
            bandit.observe(1, OFF, 1.0, 0.01)
        while not bandit.is_guarded(1, SUFFIX):
            bandit.observe(1, SUFFIX, 0.2, 0.01, explored=True)
        played = 0
        while bandit.is_guarded(1, SUFFIX):
            bandit.observe(1, OFF, 1.0, 0.01, explored=False, steps=steps_per_record)
            played += steps_per_record
        return played

    one = lifted_after(1)
    assert one >= 40
    assert abs(lifted_after(8) - one) < 8


def explore_table(ps: dict[str, float], ledger=None) -> dict:
    t = table()
    t["arms"].update({a: Arm.from_name(a).to_dict() for a in ps})
    t["buckets"][0]["explore"] = list(ps)
    t["buckets"][0]["explore_p"] = list(ps.values())
    t["ledger"] = ledger
    return t


@pytest.mark.parametrize("sample_every", [1, 8])
def test_quiet_runs_in_an_exploring_bucket_keep_the_exploration_law(sample_every, clock_reads):
    """Best off, explore ``suffix-k8-w1`` with p = 0.06 and ``ngram-k3-w1`` with p = 0.02: drawn step by step
    (sample_every = 1) or as geometric gaps (quiet runs), the arms are played at those rates, the gaps between
    explorations have the geometric mean (1 - P) / P, and with quiet runs most steps read no clock."""
    n = 30_000
    policy = TunedStrategyPolicy(
        explore_table({"suffix-k8-w1": 0.06, "ngram-k3-w1": 0.02}),
        seed=3,
        clock="thread",
        sample_every=sample_every,
    )
    played, gaps, gap = [], [], 0
    for _ in range(n):
        name = step(policy, 1)
        played.append(name)
        if name == OFF.name:
            gap += 1
        else:
            gaps.append(gap)
            gap = 0
    choices = policy.drain_choices()
    assert sum(choices.values()) == n
    for arm, p in (("suffix-k8-w1", 0.06), ("ngram-k3-w1", 0.02)):
        rate = choices[arm] / n
        assert abs(rate - p) < 4 * (p * (1 - p) / n) ** 0.5, (arm, rate)
    mean_gap = sum(gaps) / len(gaps)
    assert abs(mean_gap - 0.92 / 0.08) < 0.1 * 0.92 / 0.08
    obs = policy.drain_observations()
    assert sum(o["steps"] for o in obs) <= n and n - sum(o["steps"] for o in obs) < sample_every
    if sample_every == 1:
        assert clock_reads[0] == 2 * n and len(obs) == n
    else:  # E[min(G, 7)] quiet steps per measured off step, G geometric(0.08): ~5 of every ~6 off steps
        assert clock_reads[0] < 2 * 0.35 * n
        assert all(o["explored"] == (o["arm"] != OFF.name) for o in obs)


def test_the_ledger_still_bounds_exploration_with_quiet_runs():
    """A 3x-slow arm explored at p = 0.2 with the ledger at 1%: its realized extra time stays within the
    ledger's bound (its share, half of 1% of the greedy time: two arms besides off, plus one play and the cap)
    though most greedy steps are quiet and credited at the seconds of the measured step that carries them."""
    off_s, budget, cap = 0.01, 0.01, 2.0
    policy = TunedStrategyPolicy(
        explore_table({"ngram-k3-w1": 0.2}, ledger={"budget": budget, "cap": cap}), seed=0, clock="engine"
    )
    greedy_s = extra = 0.0
    quiet = 0
    for _ in range(20_000):
        reqs = [DraftRequest("r0", "p0", [1, 2, 3], 2, None)]
        s = policy.choose(reqs)[0]
        seconds = off_s if s.is_off else 3 * off_s
        quiet += policy._quiet == 1
        policy.observe(StepObservation(1, s.name, 1, 0, 0, seconds))
        if s.is_off:
            greedy_s += seconds
        else:
            extra += seconds - off_s
    assert quiet > 10_000  # most steps were quiet
    assert 0 < extra <= budget / 2 * greedy_s + 3 * off_s + cap * off_s


def test_a_bucket_in_debt_is_quiet_and_its_waiting_probe_plays_once_repaid(clock_reads):
    """A probe waits while its arm owes the ledger; meanwhile every step is greedy off, so the steps run
    quiet (one measured in 8, crediting the 7 quiet ones before it). The probe plays once the debt is repaid:
    2.5 off steps of debt at the arm's share of a 1% budget (half: two arms besides off) take 500 off steps;
    quiet runs delay it by at most two runs (the run decided at the measured step that repays the debt is
    credited only at its end)."""
    t = explore_table({}, ledger={"budget": 0.01, "cap": 2.0})
    t["buckets"][0]["probe"] = ["ngram-k3-w1"]
    t["arms"]["ngram-k3-w1"] = Arm.from_name("ngram-k3-w1").to_dict()
    t["buckets"][0]["off_estimate"] = 1 / 0.01
    policy = TunedStrategyPolicy(t, clock="engine", sample_every=8)
    policy.table._accounts[0]["ngram-k3-w1"] = [-2.5 * 0.01, 0.0]
    played = []
    for _ in range(600):
        reqs = [DraftRequest("r0", "p0", [1, 2, 3], 2, None)]
        s = policy.choose(reqs)[0]
        played.append(s.name)
        policy.observe(StepObservation(1, s.name, 1, 0, 0, 0.01))
    first = next(i for i, n in enumerate(played) if n != OFF.name)
    assert 500 <= first <= 500 + 2 * 8 and played.count(OFF.name) == 599
    obs = policy.drain_observations()
    assert len(obs) < 600 / 6  # mostly quiet
    assert policy.drain_choices() == {OFF.name: 599, "ngram-k3-w1": 1}


def test_a_step_that_captured_a_cuda_graph_is_no_sample_and_its_count_rides_on_the_next_off_step():
    """A CUDA-graph capture (tens of ms, once per graph key) is not the arm's per-step cost: the step is not
    recorded, and an off step's count (with the quiet steps it owed) rides on the next off sample."""
    policy = TunedStrategyPolicy(table(explore=[SUFFIX.name]), clock="engine", sample_every=8, seed=0)
    policy.update_table(table())
    reqs = [DraftRequest("r0", "p0", [1, 2, 3], 2, None)]

    def play(capture: float) -> None:
        s = policy.choose(reqs)[0]
        policy.observe(StepObservation(1, s.name, 1, 0, 0, 0.002 + capture, capture))

    for _ in range(4):
        play(0.0)  # decided (a run of 7 quiet steps starts), 3 quiet steps
    play(0.05)  # off's sample, but it captured a graph: no sample
    for _ in range(3 + 1 + 3):
        play(0.0)  # the run's last 3 quiet steps; decided: the next run starts; its first 3 quiet steps
    play(0.0)  # its sample carries every step so far, the captured one included
    assert policy.drain_choices() == {OFF.name: 13}
    obs = policy.drain_observations()
    assert [(o["arm"], o["steps"]) for o in obs] == [(OFF.name, 13)]
    assert all(o["seconds"] == pytest.approx(0.002) for o in obs)

    # a drafting step that captured is not recorded either (the window keeps only steady-state steps)
    policy.update_table(table(explore=[SUFFIX.name]))
    s = policy.choose(reqs)[0]
    assert s.name != OFF.name
    policy.observe(StepObservation(1, s.name, 1, 4, 0, 0.06, 0.05))
    assert policy.drain_observations() == []


def test_quiet_runs_span_the_batch_sizes_of_a_bucket(clock_reads):
    """The long tail's active batch size changes every few steps (a request finishes, 64 -> 63 -> ...): a quiet
    run is the bucket's, not one batch size's, so a new batch size in the same bucket does not cost a measured
    step. 120 steps at batch sizes 31 down to 16 (edges 1, 4, 16: one bucket, settled on off), 8 steps each:
    one measured step in 8, as at a fixed batch size (one per batch size before: 16), and every step counted."""
    policy = TunedStrategyPolicy(table(edges=(1, 4, 16)), clock="thread", sample_every=8, run_samples=4)
    sizes = [31 - j // 8 for j in range(128)]
    for n in sizes:
        assert step(policy, n) == OFF.name
    assert clock_reads[0] == 2 * (128 // 8) + 128 // 32  # a sample in 8 steps, a decision per run of 32
    assert policy.drain_choices() == {OFF.name: 128}
    obs = policy.drain_observations()
    # sampled at the fifth step of every 8: batch sizes 31, 30, ..., 16; the first carries 5 steps, each later
    # one the 8 steps since the previous one, whatever their batch sizes
    assert [o["batch_size"] for o in obs] == list(range(31, 15, -1))
    assert [o["steps"] for o in obs] == [5] + [8] * 15
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(bucket_edges=[1, 4, 16]))
    bandit.merge(obs)
    # the 3 quiet steps at the end ride on the next sample
    assert bandit.stats()["buckets"][2]["observations"] == 125


def test_an_exploration_the_ledger_holds_back_is_a_quiet_step():
    """Best off, ``ngram-k3-w1`` explored with p = 0.2 but deep in debt with the ledger: each exploration drawn
    is a greedy step (``deferred``), and a quiet one: the run goes on to the next draw, so the bucket is
    measured once in 8 steps, as a settled one (before: every deferred draw ended the run with a measured step,
    ~1 in 4 here). Once the arm's balance is >= 0 again it explores at the table's rate (its plays cost
    nothing over off here: same seconds per token)."""
    t = explore_table({"ngram-k3-w1": 0.2}, ledger={"budget": 0.01, "cap": 2.0})
    t["buckets"][0]["off_estimate"] = 1 / 0.002
    policy = TunedStrategyPolicy(t, clock="engine", sample_every=8, seed=1)
    policy.table._accounts[0]["ngram-k3-w1"] = [-1e6, 0.0]  # not repaid within this test
    for _ in range(800):
        assert step(policy, 1) == OFF.name
    obs = policy.drain_observations()
    assert len(obs) == 800 // 8 and sum(o["steps"] for o in obs) == 800 - 3
    sd = (800 * 0.2 * 0.8) ** 0.5
    assert 0.2 * 800 - 4 * sd < policy.table.deferred < 0.2 * 800 + 4 * sd
    assert policy.drain_choices() == {OFF.name: 800}
    policy.table._accounts[0]["ngram-k3-w1"] = [0.0, policy.table._credit[0]]  # repaid
    for _ in range(4000):
        step(policy, 1)
    rate = policy.drain_choices().get("ngram-k3-w1", 0) / 4000
    assert abs(rate - 0.2) < 4 * (0.2 * 0.8 / 4000) ** 0.5


def test_each_bucket_keeps_its_run_and_a_decision_plans_the_buckets_below():
    """One quiet run per bucket: the step that decides bucket 2's run (batch 20) also plans runs for buckets 0
    and 1 below it (settled on off: 4 * 8 - 1 quiet steps each), so the long tail's batch sizes 9 ... 1 are
    played under the lease without a decision, and back in bucket 2 its run goes on. Counts stay exact, and
    each bucket's off samples carry that bucket's steps."""
    policy = TunedStrategyPolicy(table(edges=(1, 4, 16)), clock="engine", sample_every=8)
    eng = LeasingEngine(policy)
    sizes = [20, 17, 30, 25, 18, 22] + [9, 8, 6, 5, 4] + [3, 3, 2, 2, 1, 1] + [20, 21]
    for n in sizes:
        eng.step(n)
    assert eng.asked == 1
    # each run's 4th quiet step is sampled: 18 (bucket 2), 5 (bucket 1), 2 (bucket 0)
    assert [sizes[t - 1] for t in eng.sampled] == [18, 5, 2]
    assert policy.drain_choices() == {OFF.name: len(sizes)}
    obs = policy.drain_observations()
    # bucket 2's sample carries its deciding step too; the steps after each sample ride on the next
    assert [(o["batch_size"], o["steps"]) for o in obs] == [(18, 5), (2, 4), (5, 4)]
    assert policy._owed == {2: 3, 1: 1, 0: 2}
    # the drain ended the runs: the next step decides again (the lowest bucket: nothing below to plan)
    eng.lease = None
    eng.step(2)
    assert eng.asked == 2 and policy.lease is not None and policy.lease.lo == 1 and policy.lease.hi == 4
    assert [ls.lo for ls in policy.lease.chain] == [1]


class LeasingEngine:
    """Plays steps as ``Engine`` does with leases (``speculative/strategy.py``): a leased step asks nothing, and
    a sampled one is recorded in the lease (with ``step``'s seconds)."""

    def __init__(self, policy: TunedStrategyPolicy):
        self.policy, self.lease, self.asked = policy, None, 0
        self.t = 0  # steps played
        self.sampled: list[int] = []  # the steps (1-based) sampled under a lease

    def step(self, b: int) -> str:
        lease = self.lease
        self.t += 1
        if lease is not None and not (lease.left > 0 and lease.lo <= b < lease.hi):
            lease = self.lease = lease.covering(b)
        if lease is not None:
            if lease.take():
                lease.samples.append(LeaseSample(b, b, 0.002, 0.0, 0.0, lease.left))
                self.sampled.append(self.t)
            return OFF.name
        self.asked += 1
        name = step(self.policy, b)
        self.lease = self.policy.lease
        return name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steps_played_under_the_lease_change_nothing_but_the_calls(seed):
    """The same policy (seed, table, batch sizes: a shrinking long tail with jumps across buckets, table
    updates and drains between rollouts) played by a caller that asks every step and by one that honours the
    lease: the same arm every step, the same choices and observations (arm, batch size, steps carried,
    seconds), while the leasing caller asks about far fewer steps."""
    import random

    rng = random.Random(seed)
    sizes = []
    for _ in range(6):  # rollouts
        b = rng.choice([8, 20, 40])
        while b > 0:
            sizes.append(b)
            if rng.random() < 0.15:
                b -= rng.randint(1, 3)
    ps = {"suffix-k8-w1": 0.03, "ngram-k3-w1": 0.01}
    tbl = explore_table(ps, ledger=None)
    tbl["bucket_edges"] = [1, 4, 16]
    tbl["buckets"] = [dict(tbl["buckets"][0], bucket=i, lo=lo) for i, lo in enumerate((1, 4, 16))]

    def play(leasing: bool):
        policy = TunedStrategyPolicy(tbl, seed=seed, clock="engine", sample_every=8)
        eng = LeasingEngine(policy)
        played, drained, i = [], [], 0
        for b in sizes:
            played.append(eng.step(b) if leasing else step(policy, b))
            i += 1
            if i % 97 == 0:  # a rollout boundary: drains and a new table
                drained.append((policy.drain_choices(), policy.drain_observations()))
                policy.update_table(tbl)
                eng.lease = None
        drained.append((policy.drain_choices(), policy.drain_observations()))
        return played, drained, eng.asked

    asked_every, drained_every, _ = play(False)
    leased, drained_leased, asked = play(True)
    assert leased == asked_every
    assert drained_leased == drained_every
    assert sum(sum(c.values()) for c, _ in drained_leased) == len(sizes)
    explored = sum(n != OFF.name for n in leased)
    assert explored > 0
    assert asked < len(sizes) / 3


@pytest.mark.parametrize("sample_every, period, sample_at", [(2, 2, 2), (3, 3, 3), (5, 5, 5), (8, 8, 5)])
def test_off_is_sampled_after_the_runs_first_quiet_steps(sample_every, period, sample_at, clock_reads):
    """A run of q = sample_every - 1 quiet steps: off's sample is its step after min(3, q - 1) quiet ones (the
    decision's cold-cache slowdown lasts a few steps), so the sample is step ``sample_at`` of every ``period``,
    and a caller honouring the lease is asked about the decision only: it samples the step under the lease."""
    policy = TunedStrategyPolicy(table(), clock="engine", sample_every=sample_every, run_samples=1)
    eng = LeasingEngine(policy)
    for _ in range(4 * period):
        eng.step(1)
    assert eng.sampled == [sample_at + k * period for k in range(4)]
    assert eng.asked == 4
    # each sample reaches the table at the next decision, carrying the steps since the previous one
    obs = policy.drain_observations()
    assert [o["steps"] for o in obs] == [sample_at] + [period] * 3


def test_a_run_holds_up_to_run_samples_samples_and_the_engine_is_asked_once_per_run():
    """``run_samples`` = 4: a run of 4 * sample_every - 1 quiet steps holds off's samples at its steps
    4, 4 + 8, ... (sample_every = 8), all taken under the lease, so a caller honouring it is asked about one
    step per run of 32; each sample carries the 8 steps since the previous one (the first: its run's first 5,
    the decision included), and the steps after the last ride on the next run's first."""
    policy = TunedStrategyPolicy(table(), clock="engine", sample_every=8, run_samples=4)
    eng = LeasingEngine(policy)
    for _ in range(3 * 32):
        eng.step(1)
    assert eng.asked == 3
    assert eng.sampled == [r * 32 + 1 + p for r in range(3) for p in (4, 12, 20, 28)]
    assert policy.drain_choices() == {OFF.name: 96}
    obs = policy.drain_observations()
    assert [o["steps"] for o in obs] == [5] + [8] * 11
    assert all(o["seconds"] == pytest.approx(0.002) and o["committed_tokens"] == 1 for o in obs)
    with pytest.raises(TunerConfigError, match="run_samples"):
        TunedStrategyPolicy(table(), run_samples=0)


def test_lease_samples_take_the_steps_asked_for():
    lease = Lease(10, sample_in=3, sample_every=4)
    taken = [lease.take() for _ in range(10)]
    assert [i + 1 for i, t in enumerate(taken) if t] == [3, 7]
    assert lease.left == 0
    plain = Lease(math.inf)  # FixedPolicy(off)'s: never samples
    assert not any(plain.take() for _ in range(1000)) and plain.left == math.inf
