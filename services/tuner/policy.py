"""The rollout actor's in-process strategy policy: the tuner's table + length-aware budgets, no RPC per step.

``TunedStrategyPolicy`` implements the engine's ``StrategyPolicy``: per decode step it asks its
``TablePolicy`` (a copy of the central tuner's strategy table) for the arm of the current active batch size,
then gives each request a draft budget from ``LengthBudgets`` (long requests first, per-step quota; after
DAS). After the step it records the arm's reward (committed tokens / seconds) for the central tuner, which
drains the records in batches (``drain_observations``) and sends back a newer table (``update_table``).

Which seconds (``clock``):

- ``"thread"``: the decoding thread's CPU time (``time.thread_time``) to ``observe``, from the start of
  ``choose`` for a step chosen there (a drafting step: its choice, budgets, draft, verify and commit, all that
  playing it costs, as under ``"engine"``; an off step where no quiet run starts, as where a drafting arm is
  the best), from the end of ``choose`` for off's sample in a quiet run (off's quiet steps, what off costs as
  played there, are not chosen at all). When the model runs on the CPU, that is the step's cost without the
  time the thread waited for a core: on an oversubscribed machine (other processes, other actors) wall time
  adds noise that has nothing to do with the arm, and the bandit then mistakes a busy neighbour for a slow
  arm. Why the choice
  counts for a drafting step: on the long-tail benchmark at batch 1 it is ~25-60 us of cold Python, 2-5% of a
  decode step; left out (before session 17), ``ngram-k3`` (0.86x of off per token as played in the never-worse
  rounds) was estimated at 0.95x, close enough to off to be explored freely at ~2% of the steps.
- ``"engine"``: the wall time the engine measured (``StepObservation.seconds``). Needed when the model runs on
  an accelerator (the CPU thread only launches kernels and waits), and when a caller substitutes modeled
  step times (tests).
- ``"auto"`` (default): ``"thread"`` when torch sees no CUDA device, else ``"engine"``.

A step that captured a CUDA graph (``StepObservation.capture_seconds`` > 0) is no sample under either clock:
the capture is a one-off cost of the graph key, not of the arm that first needed it (``observe``).

Quiet steps (``sample_every``, default ``OFF_SAMPLE_EVERY`` = 64): after a measured step, the table says how
many of the bucket's next steps are certain to be greedy off steps (``TablePolicy.choose_run`` /
``quiet_run``, at most ``sample_every - 1``): all of them where the bucket is settled on off or owes the regret
ledger, else the steps before its next exploration that the ledger lets play, drawn at once (geometric, the
same law as drawing each step; an exploration the ledger holds back is a greedy step like the others); none
while its best is a drafting arm or a probe is due. Those steps are quiet: they read no clock, ask nothing and
record nothing. The engine plays them without calling the policy at all, under its ``lease`` (a ``Lease`` over
the run's bucket, ``speculative/strategy.py``), so they cost what plain decoding costs (the two calls per step
were ~0.3% of a batch-1 step: quiet steps ran at 1.003x plain's in session 16); a caller that ignores leases
calls ``choose``, which plays them itself. The bucket's next off sample carries their count (``steps``: the
tuner counts them all, the window gets one sample, the ledger credits them at its seconds). The run is the
bucket's, whatever the batch sizes in it (in the long tail the active batch size changes every few steps: one
measured step per batch size made 22% of a batch-64 rollout's steps measured); one run at a time: a step in
another bucket ends it. An exploration starts a run too, so the step after it need not be measured.

Off's sample is the run's step after its first ``OFF_SAMPLE_DELAY`` (3) quiet steps (fewer in a shorter run; a
run cut short before it has none), not the step that decided the run: that one runs the policy's Python with
the caches cold (below) and its forward pass is slower after it, so its time overstated off's per-step cost by
~7% at batch 1, while a drafting arm's ~1.4x longer step carries the same absolute overhead: off looked ~2%
slower than it is next to the arms, and in two of session 16's benchmark runs the tuner promoted ``ngram-k3``
(0.92-0.97x of off in lock step) at batch 1 for one to three whole rollouts. The slowdown lasts a few steps:
with leases, the run's first three quiet steps ran 1.3-2.2% slower than plain's at batch 1 (the fourth on,
0.999x), and a sample at the run's first step 1.024x; after three quiet steps, 0.993x (session 17, per-step
timing of 8 never-worse rounds). Off's quiet steps are what the policy plays, so that is off's cost as played.
The engine plays the first quiet steps under the lease, asks about the sample step, which only reads the clock,
and plays the rest under a second lease; the sample carries the count of the bucket's off steps since the
previous sample, the deciding one included.

What that buys, measured with per-phase timing of every step in the long-tail benchmark's never-worse rounds
(session 16): with the caches cold from the forward pass, a measured step cost ~60 us of choosing, ~30 us of
recording and a forward pass 20-120 us slower after it (a thread-clock read and a few dozen lines of Python
before a forward slowed it by ~1-1.5% in a separate test), ~7-9% of a 1.4-2.3 ms decode step of the
benchmark's small model at batch 1-4; a quiet step ~1.5 us (~0.1%). Off's reward needs no sample from every
step to be known. Why 64: in 8 lock-step rounds at batch 1 (session 14) the tuned policy on a settled all-off
table ran at 0.9972 +- 0.0009 of a fixed off policy with the same drafters attached with one measured step in
8, and at 0.9998 +- 0.0013 with one in 32; with the runs above, 128 (tried) left off with so few samples that
in one of 8 rounds the tuner promoted ``ngram-k3`` at batch 1 (a 0.97x arm) for a whole rollout.
``update_table``, ``drain_observations`` and ``drain_choices`` end the run: ``drain_choices`` counts exactly
the steps played, and the quiet steps not yet carried ride on the next off sample in their bucket (the next
rollout's, at a drain).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, Lease, StepObservation, Strategy
from services.tuner.arms import TunerConfigError
from services.tuner.bandit import TablePolicy
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")
OFF_NAME = OFF.name
OFF_SAMPLE_EVERY = 64  # at most 63 quiet steps between two measured off steps in a bucket (module docstring)
OFF_SAMPLE_DELAY = 3  # quiet steps of a run played before off's sample (module docstring)


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
        sample_every: at most ``sample_every - 1`` quiet steps between two measured off steps in a bucket
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
        # the quiet run (module docstring): steps left to play without asking, for batch sizes lo <= n < hi
        # (its bucket's), and the bucket; ``lease``: the same object, handed to the engine (the run's steps
        # before off's sample, then a new one for those after it); per bucket, the quiet steps its next
        # measured off step stands for (counted in advance when a run starts, its unplayed steps taken back by
        # ``_end_quiet``); batch size -> its bucket
        self._run, self._run_bucket = Lease(), -1
        self.lease: Lease | None = None
        # off's sample is due once ``_run`` is played: then the run's ``_rest`` steps (the sample included)
        self._sampling = False
        self._rest = 0
        self._off = None  # the table's off arm, for that sample
        self._owed: dict[int, int] = {}
        self._bucket: dict[int, int] = {}
        self._was_quiet = False

    def _end_quiet(self) -> None:
        """End the quiet run, taking back its steps counted in advance but not played: the bucket's next step is
        measured, and carries exactly the quiet steps played since its last measured one."""
        self._sampling = False
        self.lease = None
        run = self._run
        unplayed = run.left + self._rest
        if unplayed:
            self._owed[self._run_bucket] -= unplayed
            self.choices[OFF_NAME] -= unplayed
            run.left = self._rest = 0  # the engine holds it too: it asks again

    def _bucket_of(self, n: int) -> int:
        i = self._bucket.get(n)
        if i is None:
            i = self._bucket[n] = self.table.bucket_of(n)
        return i

    def update_table(self, table: Mapping[str, Any]) -> None:
        self._end_quiet()
        edges = self.table.edges
        self.table.update(table)
        if self.table.edges != edges:
            # other buckets: the quiet steps not yet carried are counted (choices) but ride on no observation
            self._owed.clear()
            self._bucket.clear()

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses (problem_id, generated tokens): the per-problem length history."""
        self.budgets.history.record_many(items)

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        n = len(requests)
        run = self._run
        if run.lo <= n < run.hi:
            if run.left:
                # a quiet step (module docstring) the caller did not play under the lease: no clock, no table,
                # nothing recorded, as few operations as possible
                run.left -= 1
                self._was_quiet = True
                return [OFF] * n
            if self._sampling:  # off's sample, after the run's first quiet steps (module docstring)
                self._sampling = False
                if self.clock == "thread":
                    self._t0 = time.thread_time()
                self._arm = self._off
                # the rest of the run: the engine plays it without asking
                self._run = self.lease = Lease(self._rest - 1, run.lo, run.hi)
                self._rest = 0
                return [OFF] * n
        # a step chosen here is timed from here: choosing is part of what playing it costs (module docstring)
        t0 = time.thread_time() if self.clock == "thread" else None
        self._end_quiet()  # a batch size out of the run's bucket, or the run played: it ends here
        i = self._bucket_of(n)
        arm, q = self.table.choose_run(n, self.sample_every - 1)
        self._arm = arm
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        if q:  # the bucket's next q steps are quiet: counted now, carried by its next measured off step
            lo, hi = self.table.bucket_range(i)
            self._run, self._run_bucket = Lease(q, lo, math.inf if hi is None else hi), i
            self._owed[i] = self._owed.get(i, 0) + q
            self.choices[OFF_NAME] = self.choices.get(OFF_NAME, 0) + q
            self.lease = self._run  # the engine may play them without asking
        if arm.is_off:
            # counted like the quiet steps: it rides on the bucket's next off sample, one of the run's steps
            # when a run starts here (this step's own time holds the policy's cold work: module docstring)
            self._owed[i] = self._owed.get(i, 0) + 1
            if q:
                # off's sample is the run's step after its first OFF_SAMPLE_DELAY quiet steps (fewer in a
                # short run): the lease covers those, the sample is asked about, a second lease the rest
                head = min(OFF_SAMPLE_DELAY, q - 1)
                self._run.left, self._rest = head, q - head
                self._off, self._sampling, self._t0, self._was_quiet = arm, True, None, True
            else:  # measured here: chosen like the steps it is compared with (module docstring)
                self._t0 = t0
            return [OFF] * n
        self._t0 = t0
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
            # arm 0.7x as fast, which was then played. An off step rides, like a quiet one, on the bucket's next
            # off sample (counts stay exact); a drafting step is counted in ``choices`` only,
            # and if it explored, the capture is charged to its arm's regret-ledger balance (``forfeit``).
            self._t0 = None  # an off step's count is in ``_owed`` already: it rides on the next off sample
            self.table.forfeit(obs.batch_size, self._arm, obs.capture_seconds)
            return
        seconds = obs.seconds
        if self._t0 is not None:
            cpu = time.thread_time() - self._t0
            self._t0 = None
            if cpu > 0:  # a clock too coarse to see the step falls back to the engine's wall time
                seconds = cpu
        # an off sample carries the bucket's off steps played since its last one, itself included (counted in
        # advance); the steps of the run still to play are the next one's
        n, steps = obs.batch_size, 1
        if self._arm.is_off:
            i = self._bucket_of(n)
            owed = self._owed.pop(i, 1)
            left = self._run.left if self._run_bucket == i else 0
            if left:
                self._owed[i] = left
            steps = owed - left
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
