"""A simulated decode-step cost model for testing and benchmarking the tuner without an engine.

Step time (ms) = ``base_ms + c_ms * batch * verify_tokens + draft_ms_per_level * depth
+ draft_ms_per_request * batch``, times log-normal noise; ``verify_tokens`` = ``max_draft_tokens + 1`` per
request (1 for ``off``). Committed tokens per request = accepted + 1, where accepted is drawn per request
from a truncated geometric law: each level of the draft is accepted with probability
``p = 1 - (1 - alpha) ** tree_width`` (``alpha`` = the arm's per-token acceptance rate), up to the arm's
depth. So ``E[committed] = sum_{i=0..depth} p**i``.

``seconds_per_token(arm, b)`` is the expected time per committed token; the oracle plays, at each
batch size, the arm minimizing it. ``run`` drives any policy with ``choose(b)`` / ``observe(...)`` over a
batch-size schedule and reports its wall time next to the time the oracle needs to commit the same tokens at
the same batch sizes (``oracle_seconds``). Deterministic for a given seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.tuner.arms import Arm


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
    stall_prob: float = 0.0  # probability that a step stalls (GC pause, preemption hiccup) ...
    stall_factor: float = 1.0  # ... and takes this many times longer
    profiles: Mapping[str, ArmProfile] = field(default_factory=dict)

    def _profile(self, arm: Arm) -> ArmProfile:
        return self.profiles.get(arm.name, ArmProfile())

    def _level_p(self, arm: Arm) -> float:
        return 1.0 - (1.0 - self._profile(arm).alpha) ** arm.tree_width

    def mean_step_ms(self, arm: Arm, batch: int) -> float:
        pr = self._profile(arm)
        verify = 1 + arm.max_draft_tokens
        draft = 0.0 if arm.is_off else pr.draft_ms_per_level * arm.depth + pr.draft_ms_per_request * batch
        return self.base_ms + self.c_ms * batch * verify + draft

    def mean_committed(self, arm: Arm, batch: int) -> float:
        if arm.is_off:
            return float(batch)
        p = self._level_p(arm)
        return batch * sum(p**i for i in range(arm.depth + 1))

    def seconds_per_token(self, arm: Arm, batch: int) -> float:
        noise = math.exp(self.time_sigma**2 / 2) * (1.0 + self.stall_prob * (self.stall_factor - 1.0))
        return self.mean_step_ms(arm, batch) * noise / 1000.0 / self.mean_committed(arm, batch)

    def best_arm(self, arms: Iterable[Arm], batch: int) -> Arm:
        return min(arms, key=lambda a: self.seconds_per_token(a, batch))

    def sample(self, arm: Arm, batch: int, rng: random.Random) -> tuple[int, float]:
        """(committed tokens across the batch, seconds) for one decode step."""
        seconds = self.mean_step_ms(arm, batch) * math.exp(rng.gauss(0.0, self.time_sigma)) / 1000.0
        if self.stall_prob and rng.random() < self.stall_prob:
            seconds *= self.stall_factor
        if arm.is_off:
            return batch, seconds
        p = self._level_p(arm)
        depth = arm.depth
        committed = batch
        if p >= 1.0:
            return batch * (depth + 1), seconds
        if p <= 0.0:
            return committed, seconds
        log_p = math.log(p)
        for _ in range(batch):
            u = 1.0 - rng.random()  # (0, 1]
            committed += min(depth, int(math.log(u) / log_p))
        return committed, seconds


class Policy(Protocol):
    def choose(self, batch_size: int) -> Arm: ...

    def observe(self, batch_size: int, arm: Arm, committed_tokens: float, seconds: float) -> None: ...


@dataclass
class SimResult:
    seconds: float = 0.0
    oracle_seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    choices: list[tuple[int, str]] = field(default_factory=list)  # (batch size, arm name) per step

    @property
    def ratio(self) -> float:
        """Policy time / oracle time for the same committed tokens (1.0 = as good as the oracle)."""
        return self.seconds / self.oracle_seconds if self.oracle_seconds else math.nan

    def summary(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "oracle_seconds": self.oracle_seconds, "ratio": self.ratio,
                "tokens": self.tokens, "steps": self.steps}  # fmt: skip


def run(
    policy: Policy,
    model: CostModel,
    arms: Sequence[Arm],
    schedule: Iterable[int],
    seed: int = 0,
) -> SimResult:
    """Play ``policy`` over the batch-size ``schedule``; one decode step per entry."""
    rng = random.Random(seed)
    best_cache: dict[int, float] = {}
    res = SimResult()
    for b in schedule:
        arm = policy.choose(b)
        tokens, seconds = model.sample(arm, b, rng)
        policy.observe(b, arm, tokens, seconds)
        if b not in best_cache:
            best_cache[b] = model.seconds_per_token(model.best_arm(arms, b), b)
        res.seconds += seconds
        res.oracle_seconds += tokens * best_cache[b]
        res.tokens += tokens
        res.steps += 1
        res.choices.append((b, arm.name))
    return res


class FixedPolicy:
    """Always plays one arm (baselines: always-off, always one drafter)."""

    def __init__(self, arm: Arm) -> None:
        self.arm = arm

    def choose(self, batch_size: int) -> Arm:
        return self.arm

    def observe(self, batch_size: int, arm: Arm, committed_tokens: float, seconds: float) -> None:
        pass
