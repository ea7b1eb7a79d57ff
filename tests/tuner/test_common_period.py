"""A challenger displaces off only on evidence from the period off's estimate describes (``_common_period``).

Step costs drift with conditions the reward does not see (context length, engine size, machine speed). Off,
played most, keeps a recent slice; an explored arm's window spans much longer. Scenario: a fast phase (off 300
tokens/s, the challenger 3% slower), then a slow phase (everything 1/3 slower: the long responses left at
batch 1 at the end of a large rollout). Off's window then holds only the slow phase, the challenger's mostly
the fast one: compared whole, the challenger looked 40% faster than off and became the best."""

from __future__ import annotations

import random

from services.tuner.arms import OFF, Arm
from services.tuner.bandit import BanditConfig, BucketedBandit

NGRAM = Arm("ngram", 3)


def _run(challenger_vs_off: float, slow_phase_challenger_steps: int) -> BucketedBandit:
    bandit = BucketedBandit([OFF, NGRAM], BanditConfig(window=64, bucket_edges=[1, 2]))
    rng = random.Random(0)

    def step(arm: Arm, rate: float) -> None:
        bandit.observe(1, arm, 1.0, 1.0 / (rate * rng.uniform(0.97, 1.03)))

    for i in range(2000):  # fast phase: the challenger explored every 25th step
        step(NGRAM if i % 25 == 0 else OFF, 300.0 * (challenger_vs_off if i % 25 == 0 else 1.0))
    every = 600 // max(1, slow_phase_challenger_steps)
    for i in range(600):  # slow phase
        play = NGRAM if i % every == 0 and i // every < slow_phase_challenger_steps else OFF
        step(play, 200.0 * (challenger_vs_off if play is NGRAM else 1.0))
    return bandit


def test_a_challenger_slower_than_off_in_every_phase_is_not_promoted_by_the_phase_mix():
    bandit = _run(0.97, slow_phase_challenger_steps=6)
    off, ngram = (bandit.estimate(1, a) for a in (OFF, NGRAM))
    assert ngram > 1.3 * off  # the whole windows describe different phases
    assert bandit.table()["buckets"][0]["best"] == "off"


def test_a_challenger_faster_than_off_in_every_phase_is_promoted():
    bandit = _run(1.5, slow_phase_challenger_steps=6)
    assert bandit.table()["buckets"][0]["best"] == NGRAM.name


def test_without_enough_steps_in_the_common_period_the_challenger_waits():
    """Two challenger steps in off's period are fewer than ``min_samples_for_best``: no promotion yet, even
    for a faster arm (it keeps being explored and qualifies once it has them)."""
    assert _run(1.5, slow_phase_challenger_steps=2).table()["buckets"][0]["best"] == "off"
    assert _run(1.5, slow_phase_challenger_steps=8).table()["buckets"][0]["best"] == NGRAM.name
