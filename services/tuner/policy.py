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
  the best); for off's samples in a quiet run, the step as its player played it (the engine under the lease,
  from the end of ``choose`` for a caller that ignores it: off's quiet steps, what off costs as played there,
  are not chosen at all). When the model runs on the CPU, that is the step's cost without the time the thread
  waited for a core: on an oversubscribed machine (other processes, other actors) wall time adds noise that
  has nothing to do with the arm, and the bandit then mistakes a busy neighbour for a slow arm. Why the choice
  counts for a drafting step: on the long-tail benchmark at batch 1 it is ~25-60 us of cold Python, 2-5% of a
  decode step; left out, ``ngram-k3`` (0.86x of off per token as played in the never-worse
  rounds) was estimated at 0.95x, close enough to off to be explored freely at ~2% of the steps.
- ``"engine"``: the wall time the engine measured (``StepObservation.seconds``). Needed when the model runs on
  an accelerator (the CPU thread only launches kernels and waits), and when a caller substitutes modeled
  step times (tests).
- ``"auto"`` (default): ``"thread"`` when torch sees no CUDA device, else ``"engine"``.

A step that captured a CUDA graph (``StepObservation.capture_seconds`` > 0) is no sample under either clock:
the capture is a one-off cost of the graph key, not of the arm that first needed it (``observe``).

Quiet steps (``sample_every``, default ``OFF_SAMPLE_EVERY`` = 64; ``run_samples``, default ``OFF_RUN_SAMPLES``
= 16): after a measured step, the table says how many of the bucket's next steps are certain to be greedy off
steps (``TablePolicy.choose_run`` / ``quiet_run``, at most ``run_samples * sample_every - 1``): all of them
where the bucket is settled on off or owes the regret ledger, else the steps before its next exploration that
the ledger lets play, drawn at once (geometric, the same law as drawing each step; an exploration the ledger
holds back is a greedy step like the others); none while its best is a drafting arm or a probe is due. Those
steps are quiet: the policy is not asked about them. The engine plays them under its ``lease`` (a ``Lease``
over the run's bucket, ``speculative/strategy.py``), so they cost what plain decoding costs (the two calls per
step are ~0.3% of a batch-1 step: quiet steps run at 1.003x plain's in benchmarks); a caller that ignores
leases calls ``choose``, which plays them itself, the same way. The run is the bucket's, whatever the batch
sizes in it (in the long tail the active batch size changes every few steps: one measured step per batch size
made 22% of a batch-64 rollout's steps measured). An exploration starts a run too, so the step after it need
not be measured. ``sample_every`` = 1 measures every step (no runs).

One run per bucket, and a deciding step plans the buckets below: once its time is taken (``observe``), every
bucket below it without a run gets one where its next steps are certain to be off (``TablePolicy.plan_run``,
the same draw as at its own deciding step, made ahead), and the engine plays a step under whichever run covers
its batch size (``Lease.chain``). A rollout's batch size falls through the buckets below in its long tail; each
bucket it entered used to cost a deciding step (1.03-1.08x a plain step, ~5 per batch-16 rollout, ~0.12% of its
decode time at batch 16 in 30 never-worse rounds); with the planning a rollout at batch 4-64 has ~1. A run
outlives the batch size leaving its bucket; the unplayed steps of runs not reached before a drain are dropped
(``drain_choices`` counts the played ones).

Off's samples are steps of the run, timed by whoever plays them (``Lease.sample_in``, ``sample_every``): the
run's step after its first ``OFF_SAMPLE_DELAY`` (3) quiet steps (fewer in a shorter run) and every
``sample_every``-th after that, so at most ``sample_every - 1`` of a bucket's off steps pass between two of
its samples. They reach the table when the run ends (the next step the policy is asked about, a drain, a table
update), each carrying the count of the bucket's off steps since the previous one, the deciding step included
(``steps``: the tuner counts them all, the window gets one sample, the ledger credits them at its seconds);
the steps after the last sample ride on the bucket's next one. Under the thread clock a sample is the step's
CPU time as the engine played it, the policy's own Python left out, because that is what off's quiet steps
cost. Why not the step that decided the run: that one runs the policy's Python with the caches cold (below)
and its forward pass is slower after it, so its time overstated off's per-step cost by ~7% at batch 1, while a
drafting arm's ~1.4x longer step carries the same absolute overhead: off looked ~2% slower than it is next to
the arms, and in two benchmark runs the tuner promoted ``ngram-k3`` (0.92-0.97x of off in lock
step) at batch 1 for one to three whole rollouts. The slowdown lasts a few steps: with leases, the run's first
three quiet steps ran 1.3-2.2% slower than plain's at batch 1 (the fourth on, 0.999x), and a sample at the
run's first step 1.024x; after three quiet steps, 0.993x (per-step timing of 8 never-worse rounds).
Why samples under the lease, ``run_samples`` per run: with the sample a step the policy was
asked about, a run of 64 cost two such steps (3-6% of the off steps in the never-worse rounds, 1.03-1.07x a
plain step each at batch 1-16, ~0.1-0.3% of decode time). Now, with the runs planned below (above),
0.4-0.5% of the off steps are asked about at every batch size; the deciding step, which also hands the run's
samples to the table (~30-40 us of its ~100 us of Python at batch 1) and plans, costs 1.01-1.4x a plain step.
Why 16 samples (runs of up to 1,023 steps): with 4, a batch-1 rollout (~1,100 steps) still had ~5 deciding
steps (1.25x a plain step each, ~0.1% of its decode time); with 16, ~1.4 (its start, and the explorations,
which end a run whatever its length). A table update or a drain ends the runs anyway, and a longer run only
delays the ledger's credit for its off steps (an arm in debt waits longer to explore: the safe side).

What that buys, measured with per-phase timing of every step in the long-tail benchmark's never-worse rounds,
per phase: with the caches cold from the forward pass, a measured step cost ~60 us of choosing, ~30 us of
recording and a forward pass 20-120 us slower after it (a thread-clock read and a few dozen lines of Python
before a forward slowed it by ~1-1.5% in a separate test), ~7-9% of a 1.4-2.3 ms decode step of the
benchmark's small model at batch 1-4; a quiet step ~1.5 us (~0.1%). Off's reward needs no sample from every
step to be known. Why 64: in 8 lock-step rounds at batch 1 the tuned policy on a settled all-off
table ran at 0.9972 +- 0.0009 of a fixed off policy with the same drafters attached with one measured step in
8, and at 0.9998 +- 0.0013 with one in 32; with the runs above, 128 (tried) left off with so few samples that
in one of 8 rounds the tuner promoted ``ngram-k3`` at batch 1 (a 0.97x arm) for a whole rollout.
``update_table``, ``drain_observations`` and ``drain_choices`` end the runs: ``drain_choices`` counts exactly
the steps played, and the quiet steps not yet carried ride on the next off sample in their bucket (the next
rollout's, at a drain).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, Lease, LeaseSample, StepObservation, Strategy
from services.tuner.arms import TunerConfigError
from services.tuner.bandit import TablePolicy
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")
OFF_NAME = OFF.name
OFF_SAMPLE_EVERY = 64  # at most 63 quiet steps between two measured off steps in a bucket (module docstring)
OFF_SAMPLE_DELAY = 3  # quiet steps of a run played before off's first sample (module docstring)
OFF_RUN_SAMPLES = (
    16  # off's samples in a quiet run at most: it is at most 16 * 64 - 1 steps (module docstring)
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
        sample_every: at most ``sample_every - 1`` off steps between two of off's samples in a bucket
            (module docstring); 1 measures every step.
        run_samples: off's samples in a quiet run at most: a run is at most ``run_samples * sample_every - 1``
            steps (module docstring).

    Raises:
        TunerConfigError: unknown ``clock``, ``sample_every`` or ``run_samples`` < 1, or a malformed table.
    """

    def __init__(
        self,
        table: Mapping[str, Any],
        budgets: BudgetConfig | None = None,
        seed: int = 0,
        clock: str = "auto",
        sample_every: int = OFF_SAMPLE_EVERY,
        run_samples: int = OFF_RUN_SAMPLES,
    ):
        for key, v in (("sample_every", sample_every), ("run_samples", run_samples)):
            if not (isinstance(v, int) and v >= 1):
                raise TunerConfigError(f"TunedStrategyPolicy: {key} must be an int >= 1, got {v!r}")
        self.table = TablePolicy(table, seed=seed)
        self.budgets = LengthBudgets(budgets or BudgetConfig())
        self.clock = resolve_clock(clock)
        self.sample_every = sample_every
        # the longest quiet run (steps after the one that decides it): none where every step is measured
        self._run_max = run_samples * sample_every - 1 if sample_every > 1 else 0
        self._t0: float | None = None
        self._arm = None
        self.choices: dict[str, int] = {}  # arm name -> steps it was chosen (this actor, since last drain)
        # the quiet runs (module docstring), at most one per bucket: bucket -> the run (a ``Lease``: its steps
        # left, its bucket's batch sizes, off's samples in it) and its length; ``_chain``: the same leases, shared
        # with the engine (``Lease.chain``); ``lease``: the one handed to the engine; ``_run``: the one the last
        # quiet step was played from (a caller that ignores leases)
        self._runs: dict[int, Lease] = {}
        self._run_len: dict[int, int] = {}
        self._chain: list[Lease] = []
        self._run = Lease(chain=self._chain)
        self.lease: Lease | None = None
        # the bucket whose deciding step is to plan the runs of the buckets below it (``observe``); -1: none
        self._plan = -1
        # what ``observe`` makes of the step ``choose`` just played (module docstring): 0 a chosen step; 1 nothing
        # (a quiet step, or the off step that decided a run); 2 off's sample in a run played here
        self._quiet = 0
        # per bucket: its off steps since its last off sample, which the next one carries
        self._owed: dict[int, int] = {}
        self._bucket: dict[int, int] = {}  # batch size -> its bucket

    def _end_quiet(self) -> None:
        """End every quiet run (``_end_run``): the engine asks again."""
        for i in list(self._runs):
            self._end_run(i)
        self.lease = None

    def _end_run(self, i: int) -> None:
        """End bucket ``i``'s quiet run, if any: off's samples in it go to the table, each carrying its bucket's
        off steps since the previous one, and the steps after the last ride on the bucket's next sample."""
        run = self._runs.pop(i, None)
        if run is None:
            return
        length = self._run_len.pop(i)
        played = length - run.left
        run.left = 0  # the engine holds it too: it asks again
        self._chain.remove(run)
        self.choices[OFF_NAME] = self.choices.get(OFF_NAME, 0) + played
        owed, done = self._owed.get(i, 0), 0
        thread = self.clock == "thread"
        off = self.table.off_arm
        for s in run.samples:
            at = length - s.left  # the run's steps played through this one
            owed += at - done
            done = at
            if s.capture_seconds > 0:
                continue  # a CUDA-graph capture is no sample (``observe``): its steps ride on the next
            seconds = s.thread_seconds if thread and s.thread_seconds > 0 else s.seconds
            self.table.observe(s.batch_size, off, s.committed_tokens, seconds, steps=owed)
            owed = 0
        run.samples.clear()
        owed += played - done
        if owed:
            self._owed[i] = owed
        else:
            self._owed.pop(i, None)

    def _start_run(self, i: int, q: int) -> None:
        """Bucket ``i``'s next ``q`` steps are quiet: a run (a ``Lease`` over the bucket's batch sizes) with off's
        first sample after OFF_SAMPLE_DELAY quiet steps (fewer in a short run), then one in ``sample_every``."""
        lo, hi = self.table.bucket_range(i)
        run = Lease(
            q,
            lo,
            math.inf if hi is None else hi,
            min(OFF_SAMPLE_DELAY + 1, q),
            self.sample_every,
            chain=self._chain,
        )
        self._runs[i], self._run_len[i] = run, q
        self._chain.append(run)

    def _plan_below(self, i: int) -> None:
        """Runs for the buckets below bucket ``i`` that have none, where their next steps are certain to be off
        (``TablePolicy.plan_run``): the long tail's batch size passes through them next, and the engine then
        plays their steps without asking (module docstring)."""
        for j in range(i):
            if j not in self._runs:
                q = self.table.plan_run(j, self._run_max)
                if q:
                    self._start_run(j, q)

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
        if not (run.left > 0 and run.lo <= n < run.hi):
            run = run.covering(n)  # another bucket's run (all share ``_chain``), or none
        if run is not None:
            # a quiet step the caller did not play under the lease: played here as the engine plays it (no table,
            # nothing recorded but off's samples), with as few operations as possible
            self._run = run
            if run.take():
                self._quiet = 2
                if self.clock == "thread":
                    self._t0 = time.thread_time()
            else:
                self._quiet = 1
            return [OFF] * n
        # a step chosen here is timed from here: choosing is part of what playing it costs (module docstring)
        t0 = time.thread_time() if self.clock == "thread" else None
        i = self._bucket_of(n)
        self._end_run(i)  # played (or none): the bucket's next run is decided here
        arm, q = self.table.choose_run(n, self._run_max)
        self._arm = arm
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        self._plan = i
        if q:  # the bucket's next q steps are quiet: the engine may play them without asking
            self._start_run(i, q)
        if arm.is_off:
            # counted like the quiet steps: it rides on the bucket's next off sample, the run's first when a run
            # starts here (this step's own time holds the policy's cold work: module docstring)
            self._owed[i] = self._owed.get(i, 0) + 1
            if q:
                self._quiet = 1
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

    def _planned(self) -> None:
        """After a deciding step (``observe``, once its time is taken): plan the runs of the buckets below it and
        hand the engine a lease (its bucket's run, else any)."""
        i, self._plan = self._plan, -1
        if i > 0:
            self._plan_below(i)
        chain = self._chain
        self.lease = self._runs.get(i) or (chain[0] if chain else None)

    def observe(self, obs: StepObservation) -> None:
        quiet = self._quiet
        if quiet:
            self._quiet = 0
            if quiet == 2:  # off's sample in a run played here: recorded as the engine records it
                t0, self._t0 = self._t0, None
                run = self._run
                thread = time.thread_time() - t0 if t0 is not None else 0.0
                run.samples.append(
                    LeaseSample(
                        obs.batch_size,
                        obs.committed_tokens,
                        obs.seconds,
                        thread,
                        obs.capture_seconds,
                        run.left,
                    )
                )
            if self._plan >= 0:
                self._planned()
            return
        self._measured(obs)
        if self._plan >= 0:
            self._planned()

    def _measured(self, obs: StepObservation) -> None:
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
        # a measured off step carries the bucket's off steps since its last sample, itself included
        n, steps = obs.batch_size, 1
        if self._arm.is_off:
            steps = self._owed.pop(self._bucket_of(n), 1)
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
