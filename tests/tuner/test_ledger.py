"""A rollout actor's regret ledger (``TablePolicy``, ``BanditConfig.ledger_budget`` / ``ledger_cap``): an arm's
probes and explorations are played only while their realized extra time over off stays within its share of
the budget of the greedy steps' time, whatever the table's prices say; arms as fast as off are never held
back, and one costly arm's debt does not hold back the others."""

import random

import pytest

from services.tuner.arms import OFF, Arm, TunerConfigError, default_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, TablePolicy
from services.tuner.grpc_service import table_from_pb, table_to_pb
from services.tuner.sim import ArmProfile, CostModel

SUFFIX = Arm.from_name("suffix-k8-w1")
NGRAM = Arm.from_name("ngram-k3-w1")
OFF_S = 0.01  # seconds of one off step at batch 1 (one committed token)


def table_with(explore=(), explore_p=(), probe=(), ledger=(0.01, 2.0), off_estimate=None) -> dict:
    """A one-bucket table whose best is off."""
    return {
        "version": 1,
        "epsilon": 0.1,
        "bucket_edges": [1],
        "arms": {a.name: a.to_dict() for a in (OFF, SUFFIX, NGRAM)},
        "buckets": [
            {
                "bucket": 0,
                "lo": 1,
                "hi": None,
                "best": OFF.name,
                "explore": list(explore),
                "explore_p": list(explore_p),
                "probe": list(probe),
                "guarded": [],
                "off_estimate": off_estimate,
            }
        ],
        "ledger": None if ledger is None else {"budget": ledger[0], "cap": ledger[1]},
    }


def run(policy: TablePolicy, steps: int, cost: dict[str, tuple[float, float]], seed: int = 0) -> dict:
    """``steps`` decode steps at batch 1; ``cost[arm] = (committed tokens, seconds)`` (off: 1 token in
    ``OFF_S``, +-5%). Returns the greedy seconds, the explored steps and their extra seconds over off."""
    rng = random.Random(seed)
    greedy_s = extra = 0.0
    explored = 0
    for _ in range(steps):
        arm = policy.choose(1)
        tokens, seconds = cost.get(arm.name, (1.0, OFF_S))
        seconds *= rng.uniform(0.95, 1.05)
        policy.observe(1, arm, tokens, seconds)
        if policy._pending[-1][4]:  # the explored flag of this step's record
            explored += 1
            extra += seconds - tokens * OFF_S
        else:
            greedy_s += seconds
    return {"greedy_s": greedy_s, "explored": explored, "extra_s": extra}


def test_the_ledger_bounds_what_exploration_costs_and_without_it_the_table_decides():
    """An arm 3x slower than off per token (each play 2 off steps of extra time), explored with p = 0.2: the
    table's price is wrong by far. With the ledger (1%, cap 2 off steps) the explored steps' extra time is at
    most the arm's share of 1% of the greedy time (half: the table has two arms besides off) plus one play and
    the cap; the draws it refused are counted; without it, exploration costs ~40% of the time."""
    cost = {NGRAM.name: (1.0, 3 * OFF_S)}
    without = TablePolicy(table_with([NGRAM.name], [0.2], ledger=None), seed=0)
    r0 = run(without, 4000, cost)
    with_ledger = TablePolicy(table_with([NGRAM.name], [0.2]), seed=0)
    r = run(with_ledger, 4000, cost)
    assert r["explored"] > 5  # it still explores, at the budget's pace
    assert r["extra_s"] <= 0.01 / 2 * r["greedy_s"] + 2 * OFF_S * 1.05 + 2 * OFF_S + 1e-9
    # one draw per step either way (same seed): every exploration drawn was played or deferred
    assert r["explored"] + with_ledger.deferred == r0["explored"]
    assert r0["extra_s"] > 20 * r["extra_s"]
    assert r0["extra_s"] > 0.3 * r0["greedy_s"]


def test_an_arm_as_fast_as_off_is_never_held_back():
    """Exploring an arm that commits 2 tokens in 1.5 off steps earns time back: it is explored at the table's
    rate, as without a ledger."""
    cost = {SUFFIX.name: (2.0, 1.5 * OFF_S)}
    p = 0.1
    policy = TablePolicy(table_with([SUFFIX.name], [p]), seed=1)
    r = run(policy, 3000, cost)
    ref = run(TablePolicy(table_with([SUFFIX.name], [p], ledger=None), seed=1), 3000, cost)
    assert r["explored"] == ref["explored"]  # same draws, none refused
    assert r["extra_s"] < 0


def test_each_arm_pays_its_own_probes_and_its_balance_survives_a_table_update():
    """Two probes: a costly arm (3x off's time per token: each play 2 off steps of debt) and one as fast as off
    (2 tokens in 1.5 off steps). Both play at once (balance 0); the costly arm's debt does not hold back the
    other. In the next table version the fast arm's probe plays at once again, the costly one's waits (the
    bucket plays its best, counted in ``deferred``) until greedy steps have paid its debt back at its share
    of the budget (half of 1%: two arms besides off): ~400 steps."""
    cost = {NGRAM.name: (1.0, 3 * OFF_S), SUFFIX.name: (2.0, 1.5 * OFF_S)}
    probes = [NGRAM.name, SUFFIX.name]
    policy = TablePolicy(table_with(probe=probes, off_estimate=1 / OFF_S), seed=0)

    def steps(n):
        chosen = []
        for _ in range(n):
            arm = policy.choose(1)
            chosen.append(arm.name)
            tokens, seconds = cost.get(arm.name, (1.0, OFF_S))
            policy.observe(1, arm, tokens, seconds)
        return chosen

    assert steps(2) == probes
    assert policy.ledger_balance(0, NGRAM.name) == pytest.approx(-2 * OFF_S)
    assert policy.ledger_balance(0, SUFFIX.name) > 0  # it earned time back
    policy.update(table_with(probe=probes, off_estimate=1 / OFF_S))  # the balances carry over
    assert policy.ledger_balance(0, NGRAM.name) == pytest.approx(-2 * OFF_S)
    chosen = steps(600)
    assert chosen[0] == SUFFIX.name
    second = chosen.index(NGRAM.name)
    # debt 2 off steps, paid back at 1% / 2 of an off step per greedy step: ~400 greedy steps
    assert 350 <= second <= 450
    assert policy.deferred == second - 1
    assert chosen.count(NGRAM.name) == 1 and chosen.count(SUFFIX.name) == 1
    assert policy.ledger_balance(0, NGRAM.name) < 0  # in debt again after its second probe


def test_a_stalled_off_step_barely_moves_the_reference():
    """A 100x off step (a GC pause) moves the ledger's off seconds per token by at most its weight (5%):
    exploration does not suddenly look cheap."""
    policy = TablePolicy(table_with([SUFFIX.name], [0.0]), seed=0)  # something to explore: the ledger runs
    for _ in range(50):
        policy.observe(1, policy.choose(1), 1.0, OFF_S)
    policy.observe(1, policy.choose(1), 1.0, 100 * OFF_S)
    assert policy._off_spt[0] == pytest.approx(OFF_S * 1.05)


def test_settings_reach_the_actor_and_bad_ones_fail_clearly():
    bandit = BucketedBandit([OFF, SUFFIX], BanditConfig(ledger_budget=0.02, ledger_cap=3.0))
    table = bandit.table()
    assert table["ledger"] == {"budget": 0.02, "cap": 3.0}
    assert table_from_pb(table_to_pb(table))["ledger"] == table["ledger"]
    assert TablePolicy(table).ledger == (0.02, 3.0)
    off = BucketedBandit([OFF, SUFFIX], BanditConfig(ledger_budget=None)).table()
    assert off["ledger"] is None and table_from_pb(table_to_pb(off))["ledger"] is None
    assert TablePolicy(off).ledger is None
    with pytest.raises(TunerConfigError, match=r"tuner\.bandit\.ledger_budget"):
        BanditConfig(ledger_budget=0.0)
    with pytest.raises(TunerConfigError, match=r"tuner\.bandit\.ledger_cap"):
        BanditConfig.from_dict({"ledger_cap": -1}, source="cfg.yaml")
    bad = dict(table, ledger={"budget": 0.01})
    policy = TablePolicy(table)
    with pytest.raises(TunerConfigError, match="ledger"):
        policy.update(bad)
    assert policy.ledger == (0.02, 3.0)  # the malformed table changed nothing


def test_a_bucket_settled_on_off_banks_nothing_and_prices_by_the_table_when_it_moves():
    """Steps of a bucket with nothing to probe or explore take the fast path: recorded, no ledger entry. When a
    later table gives it something to explore, the first play is priced by the table's off estimate."""
    policy = TablePolicy(table_with(off_estimate=1 / OFF_S), seed=0)
    for _ in range(500):
        policy.observe(1, policy.choose(1), 1.0, OFF_S)
    assert policy.ledger_balance(0, NGRAM.name) == 0.0 and policy._off_spt[0] is None
    assert len(policy.drain_observations()) == 500
    policy.update(table_with([NGRAM.name], [1.0], off_estimate=1 / OFF_S))
    arm = policy.choose(1)
    assert arm == NGRAM
    policy.observe(1, arm, 1.0, 3 * OFF_S)
    assert policy.ledger_balance(0, NGRAM.name) == pytest.approx(-2 * OFF_S)
    assert policy.choose(1) == OFF  # in debt: the exploration drawn (p = 1) is deferred
    assert policy.deferred == 1


def test_costly_arms_debts_do_not_starve_a_faster_arm():
    """Default arms on a simulated batch-1 workload where ``suffix-k4`` is ~1.3x off and the learned and deep
    arms are 2-5x slower: every costly probe puts its own arm in debt, not the bucket, and once the table
    estimates the cheap arm at least as fast as off it is ``free`` (its unlucky plays' debt does not stop it),
    so it keeps being explored at the table's rate, gets promoted, and the later rollouts run faster than off.
    (With one balance per bucket the costly probes' debt blocked every exploration: the bucket stayed on off;
    with a balance per arm but no free arms, 4 of 8 seeds had not promoted it after 10 rollouts.)"""
    profiles = {
        "ngram-k3-w1": ArmProfile(alpha=0.1, draft_ms_per_request=0.01),
        "suffix-k4-w1": ArmProfile(alpha=0.5, draft_ms_per_request=0.01),
        "suffix-k8-w1": ArmProfile(alpha=0.3, draft_ms_per_request=0.01),
        "suffix-k12-w1": ArmProfile(alpha=0.3, draft_ms_per_request=0.01),
        "suffix-k24-w3-d8": ArmProfile(alpha=0.25, draft_ms_per_request=0.03),
        "learned-k2-w1": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
        "learned-k4-w1": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
        "learned-k12-w2-d6": ArmProfile(alpha=0.1, draft_ms_per_level=1.5),
        "hybrid-k8-w1": ArmProfile(alpha=0.25, draft_ms_per_level=0.5, draft_ms_per_request=0.01),
    }
    model = CostModel(base_ms=2.0, c_ms=0.27, time_sigma=0.15, profiles=profiles)
    arms = default_arms()
    assert model.best_arm(arms, 1).name == "suffix-k4-w1"
    best_speed = model.seconds_per_token(OFF, 1) / model.seconds_per_token(Arm.from_name("suffix-k4-w1"), 1)
    assert best_speed > 1.25
    rng = random.Random(0)
    # off's window about as long in steps as a rollout actor's (its quiet steps: one record per several off steps)
    central = BucketedBandit(arms, BanditConfig(seed=0, off_window=4096))
    policy = TablePolicy(central.table(), seed=100)
    speeds = []
    for _ in range(10):  # rollouts of 1,000 decode steps at batch 1, a table after each
        seconds = off_seconds = 0.0
        for _ in range(1000):
            arm = policy.choose(1)
            tokens, s = model.sample(arm, 1, rng)
            policy.observe(1, arm, tokens, s)
            seconds += s
            off_seconds += tokens * model.seconds_per_token(OFF, 1)
        speeds.append(off_seconds / seconds)
        central.merge(policy.drain_observations())
        policy.update(central.table())
    assert central.best_arms()[0] == "suffix-k4-w1"
    assert min(speeds[-2:]) > 1.15, speeds


def test_free_arms_are_those_estimated_at_least_as_fast_as_off_and_reach_the_actor():
    """The table's ``free`` list (arms the ledger lets play in debt): a drafting arm whose estimate beats off's;
    not one that is slower, not a guarded one; it survives the protobuf round trip, and an actor plays a free
    arm's exploration even when its balance is negative."""
    bandit = BucketedBandit([OFF, SUFFIX, NGRAM], BanditConfig(epsilon=0.0, min_samples_for_guard=6))
    for _ in range(20):
        bandit.observe(1, OFF, 1, OFF_S)
        bandit.observe(1, SUFFIX, 2, 1.5 * OFF_S)  # 1.33x off
        bandit.observe(1, NGRAM, 1, 1.2 * OFF_S)  # 0.83x off
    table = bandit.table()
    assert table["buckets"][0]["free"] == [SUFFIX.name]
    assert all(b["free"] == [] for b in table["buckets"][1:])  # no samples there
    assert table_from_pb(table_to_pb(table))["buckets"][0]["free"] == [SUFFIX.name]
    t = table_with([SUFFIX.name, NGRAM.name], [0.5, 0.5], off_estimate=1 / OFF_S)
    t["buckets"][0]["free"] = [SUFFIX.name]
    policy = TablePolicy(t, seed=0)
    for name in (SUFFIX.name, NGRAM.name):
        policy._accounts[0][name] = [-10 * OFF_S, 0.0]  # both deep in debt
    played = []
    for _ in range(200):
        arm = policy.choose(1)
        played.append(arm.name)
        policy.observe(1, arm, 1.0, OFF_S)
    assert played.count(SUFFIX.name) > 60  # p = 0.5, free: played
    assert played.count(NGRAM.name) == 0  # in debt: deferred
    assert policy.deferred == 200 - played.count(SUFFIX.name)


def test_a_forfeited_step_records_nothing_and_charges_an_explorations_capture_to_its_arm():
    """``forfeit``: the step the last ``choose`` drew is no sample (a CUDA-graph capture took most of it). An
    explored step's capture seconds go to its arm's ledger balance, so a capture per probe (a fresh engine per
    rollout on a GPU) waits on the budget like any costly play; a greedy step's capture charges nothing."""
    probes = [NGRAM.name, SUFFIX.name]
    policy = TablePolicy(table_with(probe=probes, off_estimate=1 / OFF_S), seed=0)
    arm = policy.choose(1)
    assert arm.name == NGRAM.name
    policy.forfeit(1, arm, 0.05)
    assert policy.drain_observations() == []
    assert policy.ledger_balance(0, NGRAM.name) == pytest.approx(-0.05)
    arm = policy.choose(1)  # the other probe: its balance is its own
    assert arm.name == SUFFIX.name
    policy.observe(1, arm, 2.0, 1.5 * OFF_S)
    assert policy.ledger_balance(0, SUFFIX.name) > 0
    # greedy steps (off): a capture there is no exploration's cost
    before = policy.ledger_balance(0, SUFFIX.name)
    arm = policy.choose(1)
    assert arm.name == OFF.name
    policy.forfeit(1, arm, 0.05)
    assert policy.ledger_balance(0, SUFFIX.name) == pytest.approx(before)
    assert policy.ledger_balance(0, NGRAM.name) == pytest.approx(-0.05)
    assert len(policy.drain_observations()) == 1  # only the suffix probe's step
    # the charged arm waits: 0.05 s of debt at half of 1% of 10 ms greedy steps is ~1,000 steps
    policy.update(table_with(probe=probes, off_estimate=1 / OFF_S))
    chosen = []
    for _ in range(400):
        a = policy.choose(1)
        chosen.append(a.name)
        policy.observe(1, a, *((2.0, 1.5 * OFF_S) if a.name == SUFFIX.name else (1.0, OFF_S)))
    assert NGRAM.name not in chosen and policy.deferred > 0
