"""Per-step speculation strategy and the pluggable policy that picks it.

The engine asks its ``StrategyPolicy`` once per decode step, for the current active batch, which
``Strategy`` each request uses; after the step it reports what the step yielded (``observe``). The fixed
policy below returns one strategy for everyone; the tuner's in-process table policy (services/tuner) is a
drop-in replacement.

Leases: a policy may also say that its next steps are certain to be plain (off) steps, by holding a
``Lease`` in its ``lease`` attribute. After each step it asked about (after ``observe``), the engine reads
``policy.lease``; while the lease has steps left and the active batch size is in its range, the engine
decodes plain steps without calling ``choose`` or ``observe`` (and without building the ``DraftRequest``
list), taking one step off ``Lease.left`` each time. A step outside the range, or an exhausted lease, goes
back to the policy, which reads ``left`` to know how many of the leased steps were played. A caller that
ignores leases keeps calling ``choose``; the policy then plays the leased steps itself. This is what makes an
adaptive policy that has settled on off cost what plain decoding costs: on the long-tail benchmark's small
CPU model the policy's two calls per step were ~0.3% of a batch-1 step (``services/tuner/policy.py``).

A policy may hold several leases at once, one per batch-size range, listed in their shared ``chain``: the
engine then plays a step under whichever covers it (the tuned policy leases the buckets below the one it
decided, which the long tail's batch size passes through next).

A lease may also ask for samples of the plain steps it covers (``sample_in``, ``sample_every``): the player
(``Lease.take``) times each such step and appends a ``LeaseSample`` to ``Lease.samples``, which the policy
reads when it is next asked. Off's cost is then measured on steps played exactly as the other leased ones,
and the policy is asked about one step per lease, not two (a step the policy is asked about costs more than
its Python: its forward pass runs slower after it).
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
    # part of ``seconds`` spent capturing CUDA graphs: a one-off cost (tens of ms, once per graph key) that a
    # policy learning per-step speed should leave out, or the arm that happened to need a new graph looks up
    # to 50x slower than its steady 1 ms steps
    capture_seconds: float = 0.0


@dataclass(slots=True)
class LeaseSample:
    """One sampled step played under a ``Lease``: what the engine measured (``StepObservation``'s fields) and
    where in the lease it fell."""

    batch_size: int
    committed_tokens: int
    seconds: float  # wall time of the whole step
    thread_seconds: float  # the decoding thread's CPU time over the step (``time.thread_time``)
    capture_seconds: float  # part of ``seconds`` spent capturing CUDA graphs (then it is no sample of off)
    left: float  # the lease's ``left`` after this step: it was the lease's step ``initial left - left``


@dataclass(eq=False, slots=True)
class Lease:
    """The next ``left`` decode steps whose active batch size ``b`` satisfies ``lo <= b < hi`` are plain
    (off) steps the policy need not be asked about nor told of (module docstring). The player (the engine)
    calls ``take`` once per step it plays under the lease; the policy may end the lease at any time by setting
    ``left`` to 0. ``left`` and ``hi`` may be ``math.inf``. Samples: the ``sample_in``-th step played (1 = the
    next) and every ``sample_every``-th after it are timed by the player, which appends a ``LeaseSample`` to
    ``samples``; ``math.inf`` (default): none. ``chain``: the policy's other leases (a list it keeps current,
    shared by all of them; each lease may be in it): a step this lease does not cover is played under the first
    lease of the chain that covers it (``covering``), and only a step none covers is asked about."""

    left: float = 0
    lo: int = 1
    hi: float = math.inf
    sample_in: float = math.inf
    sample_every: float = math.inf
    samples: list[LeaseSample] = field(default_factory=list)
    chain: list[Lease] | tuple = ()

    def covering(self, batch_size: int) -> Lease | None:
        """The first lease of ``chain`` with steps left whose range holds ``batch_size``, or None."""
        for lease in self.chain:
            if lease.left > 0 and lease.lo <= batch_size < lease.hi:
                return lease
        return None

    def take(self) -> bool:
        """Play one step under the lease: one step off ``left``. Returns True when the step is to be sampled
        (the player times it and appends its ``LeaseSample``)."""
        self.left -= 1
        s = self.sample_in - 1
        if s > 0:
            self.sample_in = s
            return False
        self.sample_in = self.sample_every
        return True


class StrategyPolicy(Protocol):
    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One strategy per request for this step (``len(requests)`` is the active batch size)."""
        ...

    def observe(self, obs: StepObservation) -> None: ...


class FixedPolicy:
    """Every request, every step: the same strategy. Off holds an unending ``Lease``: after its first step the
    engine no longer asks."""

    def __init__(self, strategy: Strategy = OFF):
        self.strategy = strategy
        self.lease = Lease(math.inf) if strategy.is_off else None

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        return [self.strategy] * len(requests)

    def observe(self, obs: StepObservation) -> None:
        pass
