"""The rollout actor's in-process strategy policy: the tuner's table + length-aware budgets, no RPC per step.

``TunedStrategyPolicy`` implements the engine's ``StrategyPolicy``: per decode step it asks its
``TablePolicy`` (a copy of the central tuner's strategy table) for the arm of the current active batch size,
then gives each request a draft budget from ``LengthBudgets`` (long requests first, per-step quota; after
DAS). After the step it records the arm's reward (committed tokens / seconds) for the central tuner, which
drains the records in batches (``drain_observations``) and sends back a newer table (``update_table``).

Which seconds (``clock``):

- ``"thread"``: the decoding thread's CPU time from ``choose`` to ``observe`` (``time.thread_time``: draft +
  verify + commit, the span of the engine's step). When the model runs on the CPU, that is the step's cost
  without the time the thread waited for a core: on an oversubscribed machine (other processes, other
  actors) wall time adds noise that has nothing to do with the arm, and the bandit then mistakes a busy
  neighbour for a slow arm.
- ``"engine"``: the wall time the engine measured (``StepObservation.seconds``). Needed when the model runs on
  an accelerator (the CPU thread only launches kernels and waits), and when a caller substitutes modeled
  step times (tests).
- ``"auto"`` (default): ``"thread"`` when torch sees no CUDA device, else ``"engine"``.

A step that captured a CUDA graph (``StepObservation.capture_seconds`` > 0) is no sample under either clock:
the capture is a one-off cost of the graph key, not of the arm that first needed it (``observe``).

Quiet steps (``sample_every``, default ``OFF_SAMPLE_EVERY`` = 32): after a greedy off step, the table says how
many of the next steps at that batch size are certain to be greedy off steps too (``TablePolicy.quiet_run``,
at most ``sample_every - 1``): all of them where the bucket is settled on off or owes the regret ledger, else
the steps before its next exploration, drawn at once (geometric, the same law as drawing each step); none
while its best is a drafting arm or a probe is due. Those steps are quiet: they read no
clock, ask nothing and record nothing; the next measured off step at that batch size carries their count
(``steps``: the tuner counts them all, the window gets one sample, the ledger credits them at its seconds).
What that buys: with the caches cold, as they are after a forward pass, the measured path costs ~30-45 us of
Python per step, ~1% of a 2.3 ms decode step of the benchmark's small model on this CPU (lock step, batch 1:
the tuned policy on an all-off table ran at 0.988-0.990x of a fixed off policy, with quiet steps 0.997x).
Off's reward needs no sample from every step to be known. Why 32 rather than 8: in 8 lock-step rounds at
batch 1 (session 14) the tuned policy on a settled all-off table ran at 0.9972 +- 0.0009 of a fixed off policy
with the same drafters attached with one measured step in 8, and at 0.9998 +- 0.0013 with one in 32: the
measured steps were most of the policy's cost, and the largest part of the adaptive engine's 0.8% gap to plain
decoding at batch 1 (the never-worse rounds of the long-tail benchmark). ``update_table``,
``drain_observations`` and ``drain_choices`` end the runs: ``drain_choices`` counts exactly the steps played,
and the quiet steps not yet carried ride on the next measured off step at their batch size (the next
rollout's, at a drain).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, StepObservation, Strategy
from services.tuner.arms import TunerConfigError
from services.tuner.bandit import TablePolicy
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")
OFF_SAMPLE_EVERY = (
    32  # at most 31 quiet steps between two measured off steps at a batch size (module docstring)
)


def resolve_clock(clock: str) -> str:
    """``"thread"`` or ``"engine"`` for a ``clock`` setting (``"auto"``: thread CPU time without CUDA)."""
    if clock not in CLOCKS:
        raise TunerConfigError(f"TunedStrategyPolicy: clock must be one of {CLOCKS}, got {clock!r}")
    if clock != "auto":
        return clock
    try:
        import torch

        return "engine" if torch.cuda.is_available() else "thread"
    except ImportError:  # no torch: no accelerator either
        return "thread"


class TunedStrategyPolicy:
    """Engine ``StrategyPolicy`` driven by a tuner table.

    Args:
        table: ``BucketedBandit.table()`` of the central tuner.
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: exploration RNG seed (one per actor so actors explore differently).
        clock: how a step's seconds are measured: ``"auto"``, ``"thread"`` or ``"engine"`` (module docstring).
        sample_every: at most ``sample_every - 1`` quiet steps between two measured off steps at a batch size
            (module docstring); 1 measures every step.

    Raises:
        TunerConfigError: unknown ``clock``, ``sample_every`` < 1, or a malformed table.
    """

    def __init__(
        self,
        table: Mapping[str, Any],
        budgets: BudgetConfig | None = None,
        seed: int = 0,
        clock: str = "auto",
        sample_every: int = OFF_SAMPLE_EVERY,
    ):
        if not (isinstance(sample_every, int) and sample_every >= 1):
            raise TunerConfigError(
                f"TunedStrategyPolicy: sample_every must be an int >= 1, got {sample_every!r}"
            )
        self.table = TablePolicy(table, seed=seed)
        self.budgets = LengthBudgets(budgets or BudgetConfig())
        self.clock = resolve_clock(clock)
        self.sample_every = sample_every
        self._t0: float | None = None
        self._arm = None
        self.choices: dict[str, int] = {}  # arm name -> steps it was chosen (this actor, since last drain)
        # quiet steps: batch size -> quiet steps left before the next measured one; batch size -> quiet steps
        # the next measured step there stands for (counted in advance, taken back by ``_end_quiet``)
        self._quiet: dict[int, int] = {}
        self._owed: dict[int, int] = {}
        self._was_quiet = False

    def _end_quiet(self) -> None:
        """Take back the quiet steps counted in advance but not played: the next step at each batch size is
        measured, and carries exactly the quiet steps played since the last measured one."""
        for n, left in self._quiet.items():
            if left:
                self._owed[n] -= left
                self.choices[OFF.name] -= left
        self._quiet.clear()

    def update_table(self, table: Mapping[str, Any]) -> None:
        self._end_quiet()
        self.table.update(table)

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses (problem_id, generated tokens): the per-problem length history."""
        self.budgets.history.record_many(items)

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        n = len(requests)
        left = self._quiet.get(n)
        if left:  # a quiet step (module docstring): no clock, no table, nothing recorded
            self._quiet[n] = left - 1
            self._was_quiet = True
            return [OFF] * n
        if self.clock == "thread":
            self._t0 = time.thread_time()
        arm = self.table.choose(n)
        self._arm = arm
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        if arm.is_off:
            q = self.table.quiet_run(n, self.sample_every - 1) if self.sample_every > 1 else 0
            if q:  # the next q steps at n are quiet: counted now, carried by the next measured off step
                self._quiet[n] = q
                self._owed[n] = self._owed.get(n, 0) + q
                self.choices[OFF.name] += q
            return [OFF] * n
        alloc = self.budgets.allocate(
            [
                (r.request_id, r.problem_id, arm.max_draft_tokens, len(r.token_ids) - r.num_prompt_tokens)
                for r in requests
            ]
        )
        return [
            Strategy(str(arm.drafter), alloc[r.request_id], arm.tree_width, arm.tree_depth) for r in requests
        ]

    def observe(self, obs: StepObservation) -> None:
        if self._was_quiet:
            self._was_quiet = False
            return
        if self._arm is None:
            return
        if obs.capture_seconds > 0:
            # Not a sample: a CUDA-graph capture (tens of ms, once per graph key) is no arm's per-step cost. On an
            # H200, captured steps (~50 ms among ~1 ms ones) in off's window put its estimate below a drafting
            # arm 0.7x as fast, which was then played. An off step rides, like a quiet one, on the next measured
            # off step at its batch size (counts stay exact); a drafting step is counted in ``choices`` only,
            # and if it explored, the capture is charged to its arm's regret-ledger balance (``forfeit``).
            self._t0 = None
            if self._arm.is_off:
                self._owed[obs.batch_size] = self._owed.get(obs.batch_size, 0) + 1
            self.table.forfeit(obs.batch_size, self._arm, obs.capture_seconds)
            return
        seconds = obs.seconds
        if self._t0 is not None:
            cpu = time.thread_time() - self._t0
            self._t0 = None
            if cpu > 0:  # a clock too coarse to see the step falls back to the engine's wall time
                seconds = cpu
        # an off step carries the quiet steps played at its batch size since the last measured one (counted in
        # advance when their countdown started; the countdown this step started, if any, is the next one's)
        n, steps = obs.batch_size, 1
        if n in self._owed and self._arm.is_off:
            owed = self._owed.pop(n)
            q = self._quiet.get(n, 0)
            if q:
                self._owed[n], owed = q, owed - q
            steps += owed
        self.table.observe(n, self._arm, obs.committed_tokens, seconds, steps=steps)

    def drain_observations(self) -> list[dict]:
        self._end_quiet()
        return self.table.drain_observations()

    def drain_choices(self) -> dict[str, int]:
        """Steps per arm name chosen since the last call (quiet steps included, exactly)."""
        self._end_quiet()
        out, self.choices = self.choices, {}
        return out

    def drain_demotions(self) -> int:
        """Buckets whose drafting best this actor demoted to off since the last call (``TablePolicy``)."""
        n, self.table.demotions = sum(self.table.demotions.values()), {}
        return n
