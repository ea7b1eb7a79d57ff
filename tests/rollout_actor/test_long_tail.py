"""``speculative.stats.long_tail`` / ``long_tail_speedup``: the long-tail phase of a step log per active batch
size, and speculation's speed-up there at equal occupancy, on hand-made ``StepRecord``s
(``tests/pipeline/test_cli.py`` checks a run's replays)."""

from __future__ import annotations

import pytest

from services.rollout_actor.requests import StepRecord
from services.rollout_actor.speculative.stats import (
    LONG_TAIL_BATCH,
    add_long_tail,
    long_tail,
    long_tail_speedup,
)


def _log(batch_tokens_seconds):
    return [StepRecord(0.0, s, b, "off", t, 0, 0, 0.0, cpu_seconds=s / 2) for b, t, s in batch_tokens_seconds]


def test_long_tail_sums_the_steps_with_few_active_requests_per_batch_size():
    log = _log([(16, 16, 0.5), (LONG_TAIL_BATCH, 8, 0.25), (1, 1, 0.125), (1, 5, 0.125)])
    assert long_tail(log) == {8: [0.25, 8], 1: [0.25, 6]}
    assert long_tail(log, max_batch=2) == {1: [0.25, 6]}
    assert long_tail(log, cpu=True) == {8: [0.125, 8], 1: [0.125, 6]}
    assert add_long_tail(long_tail(log), {"1": [1.0, 2]}) == {8: [0.25, 8], 1: [1.25, 8]}


def test_long_tail_speedup_compares_equal_occupancy_and_work():
    # plain: 4 s at batch 8 (32 tokens), 6 s alone (6 tokens); speculation: 2x faster per token at batch 8, 5x alone,
    # and it reaches batch 1 with less work left (1 s, 5 tokens): neither a seconds nor a tokens/s ratio says so
    plain = {8: [4.0, 32], 1: [6.0, 6]}
    spec = {8: [2.0, 32], 1: [1.0, 5]}
    assert long_tail_speedup(plain, spec) == pytest.approx(10.0 / (2.0 + 6 * 1.0 / 5))
    # a size speculation did not decode takes its nearest (ties: the smaller)
    assert long_tail_speedup(plain, {"8": [2.0, 32]}) == pytest.approx(10.0 / (2.0 + 6 * 2.0 / 32))
    assert long_tail_speedup({4: [1.0, 4]}, {2: [1.0, 4], 6: [1.0, 8]}) == pytest.approx(1.0)
    assert long_tail_speedup(plain, {}) is None and long_tail_speedup({}, spec) is None
