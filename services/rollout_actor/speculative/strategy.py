"""Per-step speculation strategy and the pluggable policy that picks it.

The engine asks its ``StrategyPolicy`` once per decode step, for the current active batch, which
``Strategy`` each request uses; after the step it reports what the step yielded (``observe``). The fixed
policy below returns one strategy for everyone; the tuner's in-process table policy (services/tuner) is a
drop-in replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.rollout_actor.speculative.base import DraftRequest


@dataclass(frozen=True)
class Strategy:
    """drafter: 'off' or a drafter name; max_draft_tokens: draft nodes per request per step;
    tree_width: children per node (1 = chain); tree_depth: levels (0 = max_draft_tokens)."""

    drafter: str = "off"
    max_draft_tokens: int = 0
    tree_width: int = 1
    tree_depth: int = 0

    @property
    def is_off(self) -> bool:
        return self.drafter == "off" or self.max_draft_tokens <= 0

    @property
    def name(self) -> str:
        if self.is_off:
            return "off"
        tree = f"-w{self.tree_width}d{self.tree_depth}" if self.tree_width > 1 else ""
        return f"{self.drafter}-k{self.max_draft_tokens}{tree}"


OFF = Strategy()


@dataclass
class StepObservation:
    """What one decode step yielded: committed = accepted draft tokens + one bonus/correction per request."""

    batch_size: int
    strategy: str  # Strategy.name (the step's arm)
    committed_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    seconds: float  # draft + verify wall time
    # part of ``seconds`` spent capturing CUDA graphs: a one-off cost (tens of ms, once per graph key) that a
    # policy learning per-step speed should leave out, or the arm that happened to need a new graph looks up
    # to 50x slower than its steady 1 ms steps
    capture_seconds: float = 0.0


class StrategyPolicy(Protocol):
    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One strategy per request for this step (``len(requests)`` is the active batch size)."""
        ...

    def observe(self, obs: StepObservation) -> None: ...


class FixedPolicy:
    """Every request, every step: the same strategy."""

    def __init__(self, strategy: Strategy = OFF):
        self.strategy = strategy

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        return [self.strategy] * len(requests)

    def observe(self, obs: StepObservation) -> None:
        pass
