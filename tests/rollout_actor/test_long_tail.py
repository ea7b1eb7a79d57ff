"""``speculative.stats.long_tail_tokens`` / ``tail_seconds`` / ``long_tail_speedup`` / ``long_tail_totals``: the
rollout's last tokens and speculation's speed-up on them, on hand-made ``StepRecord``s
(``tests/pipeline/test_cli.py`` checks a run's replays)."""

from __future__ import annotations

import pytest

from services.rollout_actor.requests import StepRecord
from services.rollout_actor.speculative.stats import (
    LONG_TAIL_BATCH,
    long_tail_speedup,
    long_tail_tokens,
    long_tail_totals,
    tail_seconds,
)


def _log(batch_tokens_seconds, capture=0.0):
    return [
        StepRecord(0.0, s, b, "off", t, 0, 0, 0.0, capture_seconds=capture, cpu_seconds=s / 2)
        for b, t, s in batch_tokens_seconds
    ]


def test_long_tail_tokens_counts_the_steps_with_few_active_requests():
    log = _log([(16, 16, 0.5), (LONG_TAIL_BATCH, 8, 0.25), (1, 1, 0.125), (1, 5, 0.125)])
    assert long_tail_tokens(log) == 14
    assert long_tail_tokens(log, max_batch=2) == 6


def test_tail_seconds_charges_the_crossing_step_by_its_share():
    log = _log([(16, 16, 0.5), (8, 8, 0.25), (1, 4, 0.125)])
    assert tail_seconds(log, 4) == pytest.approx(0.125)
    assert tail_seconds(log, 8) == pytest.approx(0.125 + 0.25 / 2)
    assert tail_seconds(log, 10**6) == pytest.approx(0.875)  # more than it committed: all of it
    assert tail_seconds(log, 8, cpu=True) == pytest.approx((0.125 + 0.25 / 2) / 2)
    assert tail_seconds(_log([(1, 4, 0.5)], capture=0.25), 4) == pytest.approx(0.25)  # capture left out


def test_long_tail_speedup_compares_the_same_number_of_last_tokens():
    # plain: 16 tokens at batch 16 (1 s), then its tail, 8 tokens at batch 8 (1 s) and 6 alone (6 s): 14 tokens, 7 s.
    plain = _log([(16, 16, 1.0), (8, 8, 1.0)] + [(1, 1, 1.0)] * 6)
    # speculation finishes most requests sooner: its last 14 tokens are 10 at batch 16 (0.5 s) and 4 alone (1 s);
    # its own tail phase (1 s) holds only 4 of them, so a ratio of the phases' seconds would read 7x
    spec = _log([(16, 20, 1.0), (16, 10, 0.5), (1, 4, 1.0)])
    assert long_tail_speedup(plain, spec) == pytest.approx(7.0 / 1.5)
    # a larger tail: plain's 30 tokens (8 s) against speculation's last 30 (4 + 10 + 16 of 20: 1 + 0.5 + 0.8 s)
    assert long_tail_speedup(plain, spec, max_batch=16) == pytest.approx(8.0 / 2.3)
    assert long_tail_speedup(plain, spec, cpu=True) == pytest.approx(7.0 / 1.5)
    assert long_tail_speedup(_log([(16, 16, 1.0)]), spec) is None  # plain never reached the tail


def test_long_tail_totals_sum_the_terms_of_each_pair():
    plain = _log([(16, 16, 1.0), (8, 8, 1.0)] + [(1, 1, 1.0)] * 6)
    spec = _log([(16, 20, 1.0), (16, 10, 0.5), (1, 4, 1.0)])
    once = long_tail_totals([(plain, spec)])
    assert once == {
        "tokens": 14,
        "plain_seconds": 7.0,
        "spec_seconds": 1.5,
        "speedup": pytest.approx(7.0 / 1.5),
        "spec_strategies": {"off": 1},  # the one speculative step with <= 8 active requests
        "spec_tail_tau": 4.0,  # its 4 tokens for its one request
    }
    twice = long_tail_totals([(plain, spec), (plain, plain)])
    assert (twice["tokens"], twice["spec_seconds"]) == (28, 8.5)
    assert twice["spec_strategies"] == {"off": 8}
    assert twice["spec_tail_tau"] == pytest.approx((4 + 8 + 6) / (1 + 8 + 6))
    assert twice["speedup"] == pytest.approx(14.0 / 8.5)
    assert long_tail_totals([(_log([(16, 16, 1.0)]), spec)])["speedup"] is None
