"""A simulated engine for the tuner's tests: decode-step costs from a cost model instead of a model.

Step time (ms) = ``base_ms + c_ms * batch * verify_tokens + draft_ms_per_level * depth
+ draft_ms_per_request * batch``, times log-normal noise; ``verify_tokens`` = ``max_draft_tokens + 1`` per
request (1 for ``off``). Committed tokens per request = accepted + 1, where accepted is drawn per request
from a truncated geometric law: each level of the draft is accepted with probability
``p = 1 - (1 - alpha) ** tree_width`` (``alpha`` = the arm's per-token acceptance rate), up to the arm's
depth. So ``E[committed] = sum_{i=0..depth} p**i``.

``SimEngine`` plays a strategy selector as the engine does (``speculative/strategy.py``): it asks ``choose``
and tells ``observe`` per step, except for the steps a ``Lease`` covers, which it plays as plain steps,
timing every ``sample_every``-th into ``Lease.samples``. Deterministic for a given seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import LeaseSample, StepObservation
from services.tuner.arms import OFF, Arm, Drafter


@dataclass(frozen=True)
class ArmProfile:
    """How one arm behaves in the simulation."""

    alpha: float = 0.0  # per-token acceptance rate of the drafter
    draft_ms_per_level: float = 0.0  # sequential draft cost (a learned drafter's forward per level)
    draft_ms_per_request: float = 0.0  # per-request draft cost (suffix-tree / n-gram lookups)


@dataclass
class CostModel:
    base_ms: float = 10.0
    c_ms: float = 0.25
    time_sigma: float = 0.05  # log-normal sigma of the step time
    profiles: Mapping[str, ArmProfile] = field(default_factory=dict)

    def _level_p(self, arm: Arm) -> float:
        return 1.0 - (1.0 - self.profiles.get(arm.name, ArmProfile()).alpha) ** arm.tree_width

    def mean_step_ms(self, arm: Arm, batch: int) -> float:
        pr = self.profiles.get(arm.name, ArmProfile())
        draft = 0.0 if arm.is_off else pr.draft_ms_per_level * arm.depth + pr.draft_ms_per_request * batch
        return self.base_ms + self.c_ms * batch * (1 + arm.max_draft_tokens) + draft

    def mean_committed(self, arm: Arm, batch: int) -> float:
        if arm.is_off:
            return float(batch)
        p = self._level_p(arm)
        return batch * sum(p**i for i in range(arm.depth + 1))

    def seconds_per_token(self, arm: Arm, batch: int) -> float:
        """Expected seconds per committed token (noise included)."""
        return (
            self.mean_step_ms(arm, batch)
            * math.exp(self.time_sigma**2 / 2)
            / 1e3
            / self.mean_committed(arm, batch)
        )

    def sample(self, arm: Arm, batch: int, rng: random.Random) -> tuple[int, float]:
        """(committed tokens across the batch, seconds) for one decode step."""
        seconds = self.mean_step_ms(arm, batch) * math.exp(rng.gauss(0.0, self.time_sigma)) / 1e3
        p = self._level_p(arm)
        if arm.is_off or p <= 0.0:
            return batch, seconds
        if p >= 1.0:
            return batch * (arm.depth + 1), seconds
        u = [1.0 - rng.random() for _ in range(batch)]  # (0, 1]
        return batch + sum(min(arm.depth, int(math.log(x) / math.log(p))) for x in u), seconds


@dataclass
class Step:
    batch_size: int
    arm: str
    tokens: int
    seconds: float
    asked: bool  # the selector was asked (False: played under its lease)


class SimEngine:
    """Plays ``selector`` over batch sizes with modeled step costs (module docstring); ``log`` keeps each step."""

    def __init__(self, selector, model: CostModel, seed: int = 0) -> None:
        self.selector, self.model = selector, model
        self.rng = random.Random(seed)
        self.lease = None
        self.log: list[Step] = []

    def step(self, b: int) -> Step:
        lease = self.lease
        if lease is not None and not (lease.left > 0 and lease.lo <= b < lease.hi):
            lease = self.lease = None
        if lease is not None:
            sampled = lease.take()
            tokens, seconds = self.model.sample(OFF, b, self.rng)
            if sampled:
                lease.samples.append(LeaseSample(b, tokens, seconds, 0.0, 0.0, lease.left))
            st = Step(b, OFF.name, tokens, seconds, False)
        else:
            reqs = [DraftRequest(f"r{j}", f"p{j}", [1, 2, 3], 2) for j in range(b)]
            s = self.selector.choose(reqs)[0]
            arm = OFF if s.is_off else Arm(Drafter(s.drafter), s.max_draft_tokens, s.tree_width, s.tree_depth)
            tokens, seconds = self.model.sample(arm, b, self.rng)
            self.selector.observe(StepObservation(b, s.name, tokens, 0, 0, seconds))
            self.lease = getattr(self.selector, "lease", None)
            st = Step(b, arm.name, tokens, seconds, True)
        self.log.append(st)
        return st

    def run(self, schedule: Iterable[int]) -> list[Step]:
        """One step per batch size in ``schedule``; returns those steps."""
        return [self.step(b) for b in schedule]
