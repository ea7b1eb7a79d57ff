"""Leases (``speculative/strategy.py``): the engine plays a selector's leased plain steps without asking it, the
same tokens come out, ``Lease.left`` tells the selector how many it played, and a batch size outside the
lease's range or a spent lease goes back to the selector."""

import math

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.speculative.strategy import OFF, FixedStrategy, Lease, Strategy


def _reqs(n=5):
    return [
        GenerationRequest(
            f"r{i}", [3 + i, 4, 5], SamplingParams(temperature=1.0, max_new_tokens=4 + 3 * i, seed=i)
        )
        for i in range(n)
    ]


class Counting(FixedStrategy):
    """A fixed strategy that counts the engine's calls."""

    def __init__(self, strategy=OFF, lease=True):
        super().__init__(strategy)
        if not lease:
            self.lease = None
        self.chosen: list[int] = []  # batch size of each step the engine asked about
        self.observed = 0

    def choose(self, requests):
        self.chosen.append(len(requests))
        return super().choose(requests)

    def observe(self, obs):
        self.observed += 1


def test_plain_decoding_asks_the_selector_once_and_emits_the_same_tokens(tiny_model):
    asked, every = Counting(), Counting(lease=False)
    outs = {}
    for name, pol in (("leased", asked), ("asked", every)):
        eng = Engine(tiny_model, max_batch_size=3, max_seq_len=64, eos_token_ids=[], selector=pol)
        outs[name] = (eng.generate(_reqs()), eng.step_log)
    (o1, log1), (o2, log2) = outs["leased"], outs["asked"]
    assert [o.token_ids for o in o1] == [o.token_ids for o in o2]
    assert [s.batch_size for s in log1] == [s.batch_size for s in log2]
    assert len(asked.chosen) == 1 and asked.observed == 1
    assert len(every.chosen) == len(log2) == every.observed
    assert [s.leased for s in log1] == [False] + [True] * (len(log1) - 1)
    assert not any(s.leased for s in log2) and all(s.strategy == "off" for s in log1)


def test_a_drafting_fixed_strategy_holds_no_lease():
    assert FixedStrategy(Strategy("suffix", 4)).lease is None
    assert FixedStrategy().lease.left == math.inf


class Bounded:
    """Leases ``k`` steps at batch sizes in [lo, hi) after every step it is asked about."""

    def __init__(self, k, lo, hi):
        self.k, self.lo, self.hi = k, lo, hi
        self.lease = None
        self.leases: list[Lease] = []
        self.chosen: list[int] = []

    def choose(self, requests):
        self.chosen.append(len(requests))
        return [OFF] * len(requests)

    def observe(self, obs):
        self.lease = Lease(self.k, self.lo, self.hi)
        self.leases.append(self.lease)


def test_a_lease_covers_its_batch_sizes_and_steps_only_and_left_counts_what_was_played(tiny_model):
    pol = Bounded(3, 2, 4)  # batch sizes 2 and 3, three steps at a time
    eng = Engine(tiny_model, max_batch_size=5, max_seq_len=64, eos_token_ids=[], selector=pol)
    eng.generate(_reqs())
    log = eng.step_log
    assert len(pol.chosen) + sum(s.leased for s in log) == len(log)
    for s in log:
        if s.leased:
            assert 2 <= s.batch_size < 4
    # every step outside [2, 4) was asked about; so was the step after a spent lease
    assert all(b in pol.chosen for b in {s.batch_size for s in log} - {2, 3})
    played = [3 - lease.left for lease in pol.leases]
    assert sum(played) == sum(s.leased for s in log) > 0
    # a lease that ended early (batch size out of range) kept its unplayed steps in ``left``
    runs, cur = [], 0
    for s in log:
        if s.leased:
            cur += 1
        else:
            runs.append(cur)
            cur = 0
    runs = runs[1:] + [cur]  # the steps played under each lease, in order (the first step has none before it)
    assert runs == played


def test_replacing_the_selector_drops_the_old_selectors_lease(tiny_model):
    eng = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[], selector=Counting())
    eng.generate(_reqs(2))
    second = Counting(lease=False)
    eng.selector = second
    eng.generate(_reqs(2))
    assert len(second.chosen) == len(eng.step_log) - len([s for s in eng.step_log if s.leased]) - 1
    assert second.observed == len(second.chosen) > 1


def test_cpu_clock_records_each_steps_cpu_time(tiny_model):
    eng = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[], cpu_clock=True)
    eng.generate(_reqs(2))
    assert all(s.cpu_seconds is not None and s.cpu_seconds >= 0 for s in eng.step_log)
    assert sum(s.cpu_seconds for s in eng.step_log) > 0
    off = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[])
    off.generate(_reqs(2))
    assert all(s.cpu_seconds is None for s in off.step_log)


class Sampling(Bounded):
    """Leases ``k`` steps at every batch size, asking for a sample of every 3rd step."""

    def observe(self, obs):
        self.lease = Lease(self.k, self.lo, self.hi, sample_every=3)
        self.leases.append(self.lease)


def test_the_engine_times_the_sampled_leased_steps_into_the_lease(tiny_model):
    pol = Sampling(7, 1, math.inf)
    eng = Engine(tiny_model, max_batch_size=3, max_seq_len=64, eos_token_ids=[], selector=pol)
    eng.generate(_reqs())
    log = eng.step_log
    # the leased steps in order, each with its lease and its step in it (1-based)
    leased, lease_i, at = [], -1, 0
    for s in log:
        if s.leased:
            at += 1
            leased.append((s, lease_i, at))
        else:
            lease_i, at = lease_i + 1, 0
    want = [(s, i, a) for s, i, a in leased if a in (3, 6)]
    got = [(i, x) for i, lease in enumerate(pol.leases) for x in lease.samples]
    assert len(got) == len(want) > 0
    for (s, i, a), (j, x) in zip(want, got):
        assert i == j and x.left == 7 - a
        assert (x.batch_size, x.committed_tokens, x.seconds) == (s.batch_size, s.committed, s.seconds)
        assert x.thread_seconds >= 0 and x.capture_seconds == 0
