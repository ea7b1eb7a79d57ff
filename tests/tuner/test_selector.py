"""The rollout actor's ``StrategySelector`` with the central ``BucketedBandit``, on the simulated engine
(``tests/tuner/sim.py``): convergence per batch size, the regret budget, bans with back-off, merging two actors,
leases, DAS budgets, and what a CUDA-graph capture step reports. Public API only."""

from __future__ import annotations

import pytest

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import StepObservation
from services.tuner.arms import TunerConfigError, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit, share_allowance
from services.tuner.budgets import BudgetConfig
from services.tuner.selector import StrategySelector
from tests.tuner.sim import ArmProfile, CostModel, SimEngine

X, Y = "suffix-k4-w1", "learned-k3-w1"
# X: ~2x off's throughput at batch 1, ~2x slower at batch 64; Y: slower than off everywhere
MODEL = CostModel(
    profiles={
        X: ArmProfile(alpha=0.6, draft_ms_per_request=0.5),
        Y: ArmProfile(alpha=0.1, draft_ms_per_level=3.0),
    }
)
ARMS = parse_arms(["off", X, Y])
BY_NAME = {a.name: a for a in ARMS}


def rollouts(bandit, engines, n, steps=200, sizes=(1, 64)):
    """``n`` rollouts: each engine plays ``steps`` steps at each batch size of ``sizes``, then the central bandit
    merges every actor's observations and the actors install its table. Returns the table before each."""
    tables = []
    for _ in range(n):
        tables.append(engines[0].selector_table)
        for eng in engines:
            for b in sizes:
                eng.run([b] * steps)
        bandit.merge([ob for eng in engines for ob in eng.selector.drain_observations()])
        table = bandit.table()
        for eng in engines:
            eng.selector.update_table(table)
            eng.selector_table = table
    return tables


def new_engine(bandit, seed=0, **kw):
    table = bandit.table()
    eng = SimEngine(StrategySelector(table, seed=seed, clock="engine", **kw), MODEL, seed=seed)
    eng.selector_table = table
    return eng


def best(table, bandit, b):
    return table["buckets"][bandit.bucket_of(b)]["best"]


def exploration_regret(eng, tables, bandit, b, steps=200):
    """Seconds the steps at batch size ``b`` that did not play their table's best took beyond the best's
    expected time for the same tokens (none when quicker), and all of those steps' seconds."""
    at = [s for s in eng.log if s.batch_size == b]
    extra = 0.0
    for k, s in enumerate(at):
        arm = BY_NAME[best(tables[k // steps], bandit, b)]
        if s.arm != arm.name:
            extra += max(0.0, s.seconds - s.tokens * MODEL.seconds_per_token(arm, b))
    return extra, sum(s.seconds for s in at)


def test_converges_to_the_faster_arm_at_small_batch_and_to_off_at_large_within_the_regret_budget():
    bandit = BucketedBandit(ARMS, BanditConfig(regret_budget=0.01))
    eng = new_engine(bandit)
    tables = rollouts(bandit, [eng], 30)
    after = [(best(t, bandit, 1), best(t, bandit, 64)) for t in tables[6:]]
    assert all(a == (X, "off") for a in after), after  # settled within 6 rollouts (2,400 steps), and stays
    extra, seconds = exploration_regret(eng, tables, bandit, 64)
    one_play = MODEL.mean_step_ms(BY_NAME[X], 64) / 1e3  # the budget pays for expected, not measured, extra
    assert extra <= 0.01 * seconds + one_play, (extra, seconds)
    assert extra > 0 and {X, Y} <= {s.arm for s in eng.log if s.batch_size == 64}  # both judged at batch 64
    # the settled off bucket is played under leases: the selector is asked about a small fraction of its steps
    late = [s for s in eng.log if s.batch_size == 64][-2000:]
    assert sum(s.asked for s in late) < 0.05 * len(late)
    assert all(s.asked for s in eng.log if s.batch_size == 1 and s.arm != "off")


def test_exploration_is_paid_from_an_allowance_that_carries_over_between_rollouts():
    bandit = BucketedBandit(ARMS, BanditConfig(regret_budget=0.01))
    eng = new_engine(bandit)
    rollouts(bandit, [eng], 1, steps=30, sizes=(64,))  # 1% of a 30-step rollout is less than one step
    assert {s.arm for s in eng.log} == {"off"}
    rollouts(bandit, [eng], 4, steps=30, sizes=(64,))  # ~100 steps' 1% pays for one step
    first = next(k for k, s in enumerate(eng.log) if s.arm != "off")
    assert 90 <= first < 150
    extra, seconds = exploration_regret(eng, [eng.selector_table] * 5, bandit, 64, steps=30)
    assert extra <= 0.01 * seconds + MODEL.mean_step_ms(BY_NAME[X], 64) / 1e3


def test_actors_sharing_a_table_split_its_allowance_and_a_replay_gets_none():
    bandit = BucketedBandit(ARMS, BanditConfig(regret_budget=0.01))
    eng = new_engine(bandit)
    rollouts(bandit, [eng], 3, steps=400, sizes=(64,))  # X and Y judged; an allowance built up at batch 64
    table = bandit.table()
    allowance = table["buckets"][bandit.bucket_of(64)]["allowance"]
    halves = share_allowance(table, 0.5)
    assert halves["buckets"][bandit.bucket_of(64)]["allowance"] == pytest.approx(allowance / 2)
    assert table["buckets"][bandit.bucket_of(64)]["allowance"] == allowance  # the table is not modified
    explored = {}
    for name, t in (("whole", table), ("none", share_allowance(table, 0.0))):
        e = SimEngine(StrategySelector(t, clock="engine"), MODEL, seed=5)
        e.run([64] * 30)
        explored[name] = sum(s.arm != "off" for s in e.log)
    assert explored["none"] == 0 < explored["whole"], explored


def test_a_slower_arm_is_banned_and_reprobed_with_exponential_back_off():
    bandit = BucketedBandit(ARMS, BanditConfig(regret_budget=0.05, ban_steps=400))
    eng = new_engine(bandit)
    tables = rollouts(bandit, [eng], 60, steps=100, sizes=(1,))
    banned = [Y in t["buckets"][0]["guarded"] for t in tables]
    spans, run = [], 0  # lengths (in rollouts) of the ban periods that ended
    for k, g in enumerate(banned):
        if g:
            run += 1
        elif run:
            spans.append(run)
            assert Y in tables[k]["buckets"][0]["probe"]  # re-probed after the ban
            run = 0
    assert len(spans) >= 2, banned
    assert all(b >= 1.5 * a for a, b in zip(spans, spans[1:])), spans
    assert sum(s.arm == Y for s in eng.log) < 0.02 * len(eng.log)


def test_the_central_table_merges_two_actors_observations():
    bandit = BucketedBandit(ARMS, BanditConfig())
    small, large = new_engine(bandit, seed=0), new_engine(bandit, seed=1)
    for _ in range(8):
        small.run([1] * 200)
        large.run([64] * 200)
        choices = [e.selector.drain_choices() for e in (small, large)]
        obs = small.selector.drain_observations() + large.selector.drain_observations()
        bandit.merge(obs)
        table = bandit.table()
        small.selector.update_table(table)
        large.selector.update_table(table)
        assert sum(sum(c.values()) for c in choices) == 400  # every step played, leased ones included
    st = bandit.stats()
    assert st["buckets"][0]["observations"] == 1600  # each record counts the steps it stands for
    assert st["buckets"][bandit.bucket_of(64)]["observations"] == 1600
    assert best(table, bandit, 1) == X and best(table, bandit, 64) == "off"


def _requests(n, problem=lambda j: f"p{j}"):
    return [DraftRequest(f"r{j}", problem(j), [1, 2, 3], 2) for j in range(n)]


def batch1_table(records: dict[str, tuple[float, float, int]]) -> dict:
    """The table of a bandit over ``off`` and ``records``' arms (no regret budget) that observed, at batch 1,
    each arm's ``(tokens, seconds, n)``: ``n`` steps of ``tokens`` in ``seconds`` (+-5% alternately)."""
    bandit = BucketedBandit(parse_arms(list(records)), BanditConfig(regret_budget=0.0))
    for k in range(8):
        for arm, (tokens, seconds, n) in records.items():
            if k < n:
                bandit.observe(1, arm, tokens, seconds * (1.05 if k % 2 else 0.95))
    return bandit.table()


def play_chains(sel, steps, accepted_up_to, seconds):
    """``steps`` single-request steps of suffix chains: a chain of k nodes has ``min(k, accepted_up_to)``
    accepted and takes ``seconds[k]``. Returns each step's k."""
    played = []
    for _ in range(steps):
        s = sel.choose(_requests(1))[0]
        k = s.max_draft_tokens
        played.append(k)
        acc = min(k, accepted_up_to)
        sel.observe(
            StepObservation(
                1, s.name, acc + 1, k, acc, seconds[k], draft_lengths=(k,), accepted_lengths=(acc,)
            )
        )
    return played


def test_draft_lengths_follow_the_length_aware_budgets():
    bandit = BucketedBandit(parse_arms(["off", "suffix-k32-w1"]), BanditConfig(min_samples=2))
    for _ in range(4):
        bandit.observe(3, "off", 3, 0.01)
        bandit.observe(3, "suffix-k32-w1", 24, 0.01)
    budgets = BudgetConfig(long=32, medium=8, short=4, step_quota=40, long_threshold=200, short_threshold=50)
    sel = StrategySelector(bandit.table(), budgets, clock="engine")
    sel.record_lengths([("long", 300), ("short", 10), ("m0", 100)])
    out = sel.choose(_requests(3, lambda j: ["long", "m0", "short"][j]))
    assert [s.max_draft_tokens for s in out] == [32, 8, 0]  # classes, then the quota (40), longest first
    assert {s.drafter for s in out} == {"suffix"}


def test_a_capture_step_is_counted_not_timed_and_a_bad_clock_is_an_error():
    bandit = BucketedBandit(ARMS, BanditConfig())
    sel = StrategySelector(bandit.table(), clock="engine")
    sel.choose(_requests(2))
    sel.observe(StepObservation(2, "off", 2, 0, 0, 0.5, capture_seconds=0.4))
    bandit.merge(sel.drain_observations())
    arms = bandit.stats()["buckets"][bandit.bucket_of(2)]["arms"]
    assert arms["off"]["total"] == 1 and arms["off"]["n"] == 0
    with pytest.raises(TunerConfigError, match="clock"):
        StrategySelector(bandit.table(), clock="wall")


def test_within_a_rollout_the_selector_leaves_a_stale_best_for_the_arm_its_own_steps_show_faster():
    # the central evidence (an earlier rollout) says X is the fastest; in this rollout Z is ~2x faster than X
    z_arm = "suffix-k8-w1"
    arms = parse_arms(["off", X, z_arm])
    bandit = BucketedBandit(arms, BanditConfig(regret_budget=0.05))
    for _ in range(8):
        bandit.observe(1, "off", 1, 0.010)
        bandit.observe(1, X, 4, 0.010)
        bandit.observe(1, z_arm, 3, 0.010)
    table = bandit.table()
    assert table["buckets"][0]["best"] == X and z_arm in table["buckets"][0]["explore"]
    now = CostModel(profiles={X: ArmProfile(alpha=0.2), z_arm: ArmProfile(alpha=0.9)})
    assert now.seconds_per_token(BY_NAME[X], 1) > 1.5 * now.seconds_per_token(parse_arms([z_arm])[1], 1)
    eng = SimEngine(StrategySelector(table, clock="engine"), now, seed=3)
    eng.run([1] * 600)  # one rollout: no new table
    late = eng.log[-200:]
    assert sum(s.arm == z_arm for s in late) >= 0.9 * len(late), [s.arm for s in late[:20]]
    assert eng.log[0].arm == X  # it starts from the table's best


def test_an_earlier_tables_overdraft_does_not_keep_a_rollout_from_exploring_within_its_own_budget():
    # the table's allowance is overdrawn by 0.5 s (earlier rollouts' explorations cost more than expected); the
    # rollout still explores within 1% of its own time: X plays, Y (1 ms a step slower) is tried after ~10 steps
    Y = "suffix-k8-w1"
    bandit = BucketedBandit(parse_arms(["off", X, Y]), BanditConfig(regret_budget=0.01))
    for k in range(16):
        jitter = 1.05 if k % 2 else 0.95
        bandit.observe(1, "off", 1, 0.010 * jitter)
        bandit.observe(1, X, 2, 0.010 * jitter)
        bandit.observe(1, Y, 1.8, 0.010 * jitter)
    table = bandit.table()
    row = table["buckets"][0]
    assert row["best"] == X and Y in row["explore"]
    row["allowance"] = -0.5  # seconds
    sel = StrategySelector(table, clock="engine")
    played = []
    for _ in range(200):
        s = sel.choose(_requests(1))[0]
        played.append(s.max_draft_tokens)
        tokens = 2 if s.max_draft_tokens == 4 else 1.8
        sel.observe(StepObservation(1, s.name, tokens, s.max_draft_tokens, 1, 0.010))
    # each Y step costs 1 ms more than X's for its tokens; in all, within 1% of the 2 s (and one step)
    assert 8 in played[:40] and played.count(8) * 0.001 <= 0.01 * 2.0 + 0.001, played


def test_a_chains_steps_judge_the_shorter_chains_of_its_drafter_without_playing_them():
    # the table (an earlier rollout) says k8 is fastest: 3 tokens in 20 ms against k4's 1.2 in 10 ms. In this
    # rollout no draft is accepted past its 2nd node, so k4 commits what k8 does in its cheaper steps
    k4, k8 = "suffix-k4-w1", "suffix-k8-w1"
    bandit = BucketedBandit(parse_arms(["off", k4, k8]), BanditConfig(regret_budget=0.0))
    for _ in range(8):
        bandit.observe(1, "off", 1, 0.010)
        bandit.observe(1, k4, 1.2, 0.010)
        bandit.observe(1, k8, 3, 0.020)
    table = bandit.table()
    assert table["buckets"][0]["best"] == k8
    sel = StrategySelector(table, clock="engine")
    played = play_chains(sel, 40, 2, {4: 0.010, 8: 0.020})  # the arms' step costs, as in the table
    assert played[0] == 8 and 4 in played and played[-10:] == [4] * 10  # switched; nothing was explored
    assert set(played[played.index(4) :]) == {4}  # once the best, it stays
    # no counterfactual record reaches the tuner: its records are the steps played
    obs = sel.drain_observations()
    assert sum(o["steps"] for o in obs) == 40 and {o["arm"] for o in obs} == {k4, k8}


def test_a_longer_chain_of_the_bests_drafter_is_explored_first_and_takes_over_when_its_drafts_now_pay():
    # the table (earlier rollouts, drafts without a history) says k4 is best; k8's estimate is stale and below the
    # n-gram arm's, so an upper-bound order would explore the n-gram arm first. Now drafts are accepted up to 7
    # tokens: k8 commits 8 tokens per 15 ms step, k4 5 per 12 ms. k8's steps also judge k4 (its prefix), so it
    # is explored first, and it takes over
    k4, k8, ngram = "suffix-k4-w1", "suffix-k8-w1", "ngram-k3-w1"
    bandit = BucketedBandit(parse_arms(["off", k4, k8, ngram]), BanditConfig(regret_budget=0.05))
    for k in range(8):
        jitter = 1.05 if k % 2 else 0.95
        bandit.observe(1, "off", 1, 0.010 * jitter)
        bandit.observe(1, k4, 2.4, 0.012 * jitter)
        bandit.observe(1, k8, 1.5, 0.015 * jitter)
        bandit.observe(1, ngram, 1.8, 0.010 * jitter)
    table = bandit.table()
    assert table["buckets"][0]["best"] == k4 and {k8, ngram} <= set(table["buckets"][0]["explore"])
    sel = StrategySelector(table, clock="engine")
    played = []
    for _ in range(300):
        s = sel.choose(_requests(1))[0]
        played.append(s.name)
        if s.drafter == "ngram":
            obs = StepObservation(1, s.name, 2, 3, 1, 0.010, draft_lengths=(3,), accepted_lengths=(1,))
        else:
            k = s.max_draft_tokens
            acc = min(k, 7)
            seconds = {4: 0.012, 8: 0.015}[k]
            obs = StepObservation(
                1, s.name, acc + 1, k, acc, seconds, draft_lengths=(k,), accepted_lengths=(acc,)
            )
        sel.observe(obs)
    explored = [n for n in played if n != "suffix-k4"]  # strategy names: the arm's without the tree width
    assert explored[0] == "suffix-k8", played[:40]
    # k8 is the best; the n-gram arm (6 ms extra a step) is explored within 5% of the time
    late = played[-100:]
    assert late.count("suffix-k8") >= 80 and "suffix-k4" not in late, late


def test_an_overdrawn_budget_still_lets_an_arm_as_fast_as_the_best_be_played():
    # as above, but the bucket's allowance is overdrawn (exploration spent more than its budget while drafts did
    # not pay): an arm whose expected extra time is nil costs nothing in expectation, so it is still played,
    # and its own steps show it faster (before, the bucket played plain, leased, until 1% of ~50 s had accrued)
    arms = parse_arms(["off", X])
    bandit = BucketedBandit(arms, BanditConfig(regret_budget=0.01))
    for k in range(16):
        s = 0.014 * (1.05 if k % 2 else 0.95)
        bandit.observe(16, "off", 16, s)
        bandit.observe(16, X, 16, s)
    table = bandit.table()
    table["buckets"][bandit.bucket_of(16)]["allowance"] = -0.5  # seconds
    now = CostModel(profiles={X: ArmProfile(alpha=0.9, draft_ms_per_request=0.1)})
    eng = SimEngine(StrategySelector(table, clock="engine"), now, seed=2)
    first = eng.run([16] * 100)
    assert sum(s.arm == X for s in first) >= 0.8 * len(first), [s.arm for s in first[:20]]


def test_an_arm_as_fast_as_the_best_is_explored_while_an_untried_arm_waits_for_its_budget():
    # the central evidence (drafts without a history) says X is as fast as off at batch 16, and the n-gram arm
    # is untried; now X's drafts pay (~1.8x off). The untried arm's probe would cost a whole step, which the
    # budget pays only after ~100 steps; X's expected extra cost is nil, so it is explored at once (with the
    # probe as the only candidate, the first ~100 steps would be plain).
    ngram = "ngram-k3-w1"
    arms = parse_arms(["off", X, ngram])
    bandit = BucketedBandit(arms, BanditConfig(regret_budget=0.01))
    for k in range(16):
        s = 0.014 * (1.05 if k % 2 else 0.95)
        bandit.observe(16, "off", 16, s)
        bandit.observe(16, X, 16, s)
    row = bandit.table()["buckets"][bandit.bucket_of(16)]
    assert row["best"] == "off" and X in row["explore"] and ngram in row["probe"]
    now = CostModel(
        profiles={X: ArmProfile(alpha=0.9, draft_ms_per_request=0.1), ngram: ArmProfile(alpha=0.1)}
    )
    assert now.seconds_per_token(BY_NAME["off"], 16) > 1.5 * now.seconds_per_token(BY_NAME[X], 16)
    eng = SimEngine(StrategySelector(bandit.table(), clock="engine"), now, seed=2)
    first = eng.run([16] * 100)
    assert sum(s.arm == X for s in first) >= 0.8 * len(first), [s.arm for s in first[:20]]


def test_the_tables_best_is_kept_until_another_arm_is_reliably_faster_than_it():
    # the table: off 100 tokens/s, X 200 (its best), Y untried; steps' seconds vary +-20%
    bandit = BucketedBandit(ARMS, BanditConfig(min_samples=4, regret_budget=0.05))
    for k in range(16):
        jitter = 1.2 if k % 2 else 0.8
        bandit.observe(1, "off", 1, 0.010 * jitter)
        bandit.observe(1, X, 2, 0.010 * jitter)
    table = bandit.table()
    assert table["buckets"][0]["best"] == X and table["buckets"][0]["probe"] == [Y]
    sel, n = StrategySelector(table, clock="engine"), {}

    def step(tokens_of_y):
        s = sel.choose(_requests(1))[0]
        k = s.max_draft_tokens  # X drafts 4 tokens, Y 3, off 0
        n[k] = n.get(k, 0) + 1
        tokens, jitter = {4: 2, 3: tokens_of_y}.get(k, 1), 1.2 if n[k] % 2 else 0.8
        sel.observe(StepObservation(1, s.name, tokens, s.max_draft_tokens, 1, 0.010 * jitter))
        ob = sel.drain_observations()[-1]
        return ob["arm"], ob["explored"]

    assert step(2.2) == (X, False)  # the best first: exploration is priced against its step
    # Y (its own estimate ~220 tokens/s against X's 200, +-20% per step) is above X but not reliably: X stays
    # the best (Y is played as an exploration of nil expected extra time)
    steps = [step(2.2) for _ in range(40)]
    assert (Y, True) in steps and (Y, False) not in steps, steps
    # Y now commits twice X's tokens: reliably faster within a few steps, it becomes the best
    steps = [step(4.0) for _ in range(40)][10:]
    assert {a for a, explored in steps if not explored} == {Y}, steps


@pytest.mark.parametrize("neighbour_speedup", [2.0, 0.5])
def test_a_bucket_without_budget_tries_the_arm_its_nearest_bucket_shows_faster(neighbour_speedup):
    # batch 1 (the tail's single requests) has the evidence of off and of an n-gram arm as fast, X untried and
    # an overdrawn allowance; at batch 8 the table has X at `neighbour_speedup` x off's throughput. Now X pays
    # at batch 1 (~1.8x). X shown faster next door is expected to cost nothing here: tried at once, then played
    # on its own evidence; X shown slower waits for a budget that is not there (off, under a lease). (Before,
    # X's cost was one step of off, which the overdrawn budget could not pay.)
    ngram = "ngram-k3-w1"
    arms = parse_arms(["off", X, ngram])
    bandit = BucketedBandit(arms, BanditConfig(regret_budget=0.01))
    for k in range(16):
        s = 0.011 * (1.05 if k % 2 else 0.95)
        bandit.observe(1, "off", 1, s)
        bandit.observe(1, ngram, 1, s)
        bandit.observe(8, "off", 8, 0.012 * (1.05 if k % 2 else 0.95))
        bandit.observe(8, X, 8 * neighbour_speedup, 0.012 * (1.05 if k % 2 else 0.95))
    table = bandit.table()
    row = table["buckets"][bandit.bucket_of(1)]
    assert row["best"] == "off" and X in row["probe"]
    row["allowance"] = -0.5  # seconds
    now = CostModel(
        profiles={X: ArmProfile(alpha=0.9, draft_ms_per_request=0.1), ngram: ArmProfile(alpha=0.05)}
    )
    assert now.seconds_per_token(BY_NAME["off"], 1) > 1.5 * now.seconds_per_token(BY_NAME[X], 1)
    eng = SimEngine(StrategySelector(table, clock="engine"), now, seed=3)
    played = [s.arm for s in eng.run([1] * 60)]
    if neighbour_speedup > 1:
        # the first step times the best under this table (nothing is explored before), the second tries X
        assert played[:2] == ["off", X] and played.count(X) >= 0.8 * len(played), played[:20]
    else:
        assert set(played) == {"off"}, played[:20]


def test_a_bucket_never_visited_plays_off_then_judges_the_arm_it_borrows_from_a_smaller_bucket():
    # only batch 1 has evidence (X ~2x off there). Batch 64 has no record at all and no budget: it plays off,
    # not batch 1's X, and X is no free probe there: a speed-up measured at a smaller batch size is no lower
    # bound at a larger one. Merged, off's records there let the table borrow batch 1's X for batch 64; the next
    # rollout plays it until its own steps show it ~2x slower than off (min_samples steps), then off; merged
    # again, X is banned at batch 64 and kept at batch 1.
    bandit = BucketedBandit(ARMS, BanditConfig(regret_budget=0.01))
    for k in range(16):
        jitter = 1.05 if k % 2 else 0.95
        bandit.observe(1, "off", 1, 0.010 * jitter)
        bandit.observe(1, X, 2, 0.010 * jitter)
    table = bandit.table()
    row = table["buckets"][bandit.bucket_of(64)]
    assert row["best"] == "off" and not row["windows"] and table["buckets"][0]["best"] == X
    row["allowance"] = -0.5  # seconds: no budget pays for a probe
    assert MODEL.seconds_per_token(BY_NAME[X], 64) > 1.5 * MODEL.seconds_per_token(BY_NAME["off"], 64)
    eng = SimEngine(StrategySelector(table, clock="engine"), MODEL, seed=3)
    assert {s.arm for s in eng.run([64] * 80)} == {"off"}
    bandit.merge(eng.selector.drain_observations())
    table = bandit.table()
    assert table["buckets"][bandit.bucket_of(64)]["best"] == X  # borrowed: off has its estimate there now
    eng.selector.update_table(table)
    played = [s.arm for s in eng.run([64] * 80)]
    n = BanditConfig().min_samples
    assert played[:n] == [X] * n and played.count(X) == n and set(played[-40:]) == {"off"}, played[:20]
    bandit.merge(eng.selector.drain_observations())
    table = bandit.table()
    row = table["buckets"][bandit.bucket_of(64)]
    assert row["best"] == "off" and X in row["guarded"] and table["buckets"][0]["best"] == X


@pytest.mark.parametrize("accepted_up_to", [7, 2])
@pytest.mark.parametrize("k8_records", [0, 8])
def test_a_longer_chain_is_probed_without_budget_while_the_bests_drafts_are_accepted_whole(
    accepted_up_to, k8_records
):
    # the table says k4 beats off at batch 1, and has no record of k8 or records of other problems' drafts that
    # put it below k4; the regret budget is zero. Drafts are now accepted up to `accepted_up_to` tokens. Up to 7:
    # every k4 draft is accepted whole, so k8 (the same first 4 nodes and 4 more) is tried as free and,
    # committing 8 tokens per 15 ms against k4's 5 per 12 ms, takes over. Up to 2: k4's drafts end in a
    # rejection, not at their length, and k8 waits for a budget
    k4, k8 = "suffix-k4-w1", "suffix-k8-w1"
    table = batch1_table({"off": (1, 0.010, 8), k4: (3, 0.012, 8), k8: (2.5, 0.015, k8_records)})
    assert table["buckets"][0]["best"] == k4
    assert k8 in table["buckets"][0]["explore" if k8_records else "probe"]
    played = play_chains(StrategySelector(table, clock="engine"), 60, accepted_up_to, {4: 0.012, 8: 0.015})
    if accepted_up_to > 4:
        assert played[:8] == [4] * 8 and played[8] == 8, played  # after SATURATION_MIN_ROWS rows of k4
        assert played[-20:] == [8] * 20, played
    else:
        assert set(played) == {4}, played


def test_a_shorter_chain_takes_over_only_when_this_rollouts_steps_show_it_faster():
    # the table (rollouts of other problems): off commits 1 token per 20 ms, k8 1.5 per 15 ms (the best); k4 has
    # 3 records at 9 per 10 ms, too few for an estimate. In this rollout drafts are accepted up to 7 tokens: k8
    # commits 8 per 15 ms, and its steps say k4 would commit 5 (at k4's 10 ms in the table), slower. Blended
    # with the table's records, k4's beat k8's; this rollout's records alone do not: k8 stays the best
    k4, k8 = "suffix-k4-w1", "suffix-k8-w1"
    table = batch1_table({"off": (1, 0.020, 8), k8: (1.5, 0.015, 8), k4: (9, 0.010, 3)})
    assert table["buckets"][0]["best"] == k8
    played = play_chains(StrategySelector(table, clock="engine"), 60, 7, {4: 0.010, 8: 0.015})
    assert set(played) == {8}, played


def test_a_speed_up_measured_at_64_to_72_active_requests_is_not_played_at_112_to_127():
    # a GPU-like cost curve: X's verify turns compute-bound, ~10% faster than off at 64-72 active requests,
    # ~10% slower at 112-127 (measured on the H200, Qwen2.5-7B: suffix-k4 1.04x off at 64-72, 0.61x at
    # 100-127). The default buckets keep the two apart: the first rollout at 112-127 plays off, and 64-72 keeps
    # X. (With octave buckets, 64-127 pooled them: X on ~90% of that rollout's steps at ~1.11x off's time, and
    # afterwards off at 64-72 too.)
    model = CostModel(base_ms=10.0, c_ms=0.055, profiles={X: ArmProfile(alpha=0.6)})
    off, x = BY_NAME["off"], BY_NAME[X]
    assert model.seconds_per_token(off, 68) > 1.08 * model.seconds_per_token(x, 68)
    assert model.seconds_per_token(x, 120) > 1.08 * model.seconds_per_token(off, 120)
    bandit = BucketedBandit(parse_arms(["off", X]))
    eng = SimEngine(StrategySelector(bandit.table(), clock="engine", seed=1), model, seed=1)

    def rollout(lo, hi, steps=300):
        log = eng.run([lo + k % (hi - lo) for k in range(steps)])
        bandit.merge(eng.selector.drain_observations())
        eng.selector.update_table(bandit.table())
        return log

    for _ in range(6):
        rollout(64, 73)
    assert best(bandit.table(), bandit, 68) == X
    log = rollout(112, 128)
    off_seconds = sum(model.seconds_per_token(off, s.batch_size) * s.tokens for s in log)
    assert sum(s.arm == X for s in log) <= 0.1 * len(log)
    assert sum(s.seconds for s in log) <= 1.03 * off_seconds
    assert best(bandit.table(), bandit, 68) == X and best(bandit.table(), bandit, 120) == "off"
