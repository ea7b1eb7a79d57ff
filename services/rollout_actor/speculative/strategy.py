"""Per-step speculation strategy and the pluggable selector that picks it.

The engine asks its ``StrategySelector`` once per decode step, for the current active batch, which
``Strategy`` each request uses; after the step it reports what the step yielded (``observe``). ``FixedStrategy``
returns one strategy for everyone; the tuner's ``services.tuner.selector.StrategySelector`` is a drop-in
replacement. ("Policy" in this project means the RL policy, the model being trained.)

Leases: a selector may say that its next steps are plain (off) steps by holding a ``Lease`` in its ``lease``
attribute. After each step it was asked about (after ``observe``), the engine reads ``selector.lease``; while
the lease has steps left and the active batch size is in ``[lo, hi)``, the engine decodes plain steps without
calling ``choose`` or ``observe`` (nor building the ``DraftRequest`` list), calling ``Lease.take`` once per
step. Every ``sample_every``-th leased step is timed and appended to ``Lease.samples`` as a ``LeaseSample``.
A step outside the range, or an exhausted lease, goes back to the selector, which reads ``left`` and
``samples`` to account for the leased steps. A selector may end its lease at any time by setting ``left`` to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    # part of ``seconds`` spent capturing CUDA graphs: a one-off cost of a graph key, not of the step's arm
    capture_seconds: float = 0.0
    # per request of the step (engine order): draft nodes verified [B], and accepted nodes of the draft's
    # first-child chain [B] (a chain: its accepted count; ``verify_step.chain_accepted``); 0 for ``off`` rows.
    # The chain of its first k nodes would have had min(accepted, k) accepted.
    draft_lengths: tuple[int, ...] = ()
    accepted_lengths: tuple[int, ...] = ()


@dataclass(slots=True)
class LeaseSample:
    """One timed step played under a ``Lease``."""

    batch_size: int
    committed_tokens: int
    seconds: float  # wall time of the whole step
    thread_seconds: float  # the decoding thread's CPU time over the step (``time.thread_time``)
    capture_seconds: float  # part of ``seconds`` spent capturing CUDA graphs
    left: float  # the lease's ``left`` after this step


@dataclass(eq=False, slots=True)
class Lease:
    """The next ``left`` decode steps whose active batch size ``b`` satisfies ``lo <= b < hi`` are plain (off)
    steps the selector need not be asked about nor told of (module docstring). ``hi`` may be ``math.inf``,
    ``left`` too. Every ``sample_every``-th step taken (0: none) is timed by the player into ``samples``."""

    left: float = 0
    lo: int = 1
    hi: float = math.inf
    sample_every: int = 0
    samples: list[LeaseSample] = field(default_factory=list)
    taken: int = 0

    def take(self) -> bool:
        """Play one step under the lease: one step off ``left``. Returns True when the player is to time the
        step and append its ``LeaseSample``."""
        self.left -= 1
        self.taken += 1
        return self.sample_every > 0 and self.taken % self.sample_every == 0


class StrategySelector(Protocol):
    """Picks each decode step's speculation strategies (may also hold a ``lease``: module docstring)."""

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One strategy per request for this step (``len(requests)`` is the active batch size)."""
        ...

    def observe(self, obs: StepObservation) -> None: ...


class FixedStrategy:
    """Every request, every step: the same strategy. Off holds an unending ``Lease``: after its first step the
    engine no longer asks."""

    def __init__(self, strategy: Strategy = OFF):
        self.strategy = strategy
        self.lease = Lease(math.inf) if strategy.is_off else None

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        return [self.strategy] * len(requests)

    def observe(self, obs: StepObservation) -> None:
        pass
