"""The rollout actor's in-process strategy selector: the tuner's table, a regret budget, DAS draft budgets.

``StrategySelector`` implements the engine's ``StrategySelector`` protocol (``speculative/strategy.py``). Per
decode step it finds the active batch size's bucket in its copy of the central table (``bandit.py``) and plays:

0. the bucket's *best*: the table's, unless this selector's own steps since the table arrived say otherwise.
   Per (bucket, arm) it keeps its own window of (tokens, seconds) records (``RateWindow``, the table's
   ``window`` and ``min_samples``); an arm's estimate is its own window's when that has ``min_samples``
   records, else the table's (``estimates``). The best is off unless an arm is reliably faster than off (the
   table's ``z``), then the fastest such arm: the bandit's rule (``bandit.py``) on fresher evidence. Within a
   rollout (a table is installed at rollout boundaries) the drafters' state moves (a new RL step's history,
   siblings finishing), so the central evidence of earlier rollouts can be stale; the own windows start empty
   with each table;
1. a ``probe`` arm (no estimate yet), else an ``explore`` arm (the other arms with an estimate; guarded and
   gated arms are never played), the one it played least under this table version,
   while the bucket's *regret budget* has room: exploration's measured extra time over the best arm,
   ``sum(max(0, seconds - tokens / R_best))`` over the probe and exploration steps, is at most
   ``regret_budget`` times the bucket's time (all its steps' seconds; ``R_best`` is this actor's moving
   estimate of the best arm's throughput, and nothing is explored before it has one). So exploration costs at
   most that fraction of the time, plus one step;
2. else the table's ``best``.

Each drafting request's draft length is capped by the length-aware budgets (``budgets.py``, after DAS).

Lease: when the best is off and nothing may be explored (no candidates, or the budget spent), the selector
hands the engine a ``Lease`` over the bucket's batch sizes for as many steps as the budget needs to recover
(at most ``lease_steps``): the engine plays them as plain steps without asking, timing every
``sample_every``-th for off's estimate. At the next step the selector is asked about, the leased steps are
counted in the bucket's time and reported to the tuner (each sample carries the steps since the previous one).

Seconds (``clock``): ``"thread"``: the decoding thread's CPU time (``time.thread_time``) from ``choose`` to
``observe`` (on a shared CPU machine other processes' load does not leak into an arm's reward); ``"engine"``:
the engine's wall time (``StepObservation.seconds``), needed on CUDA where the thread waits for kernels;
``"auto"``: thread without CUDA, else engine. A step that captured a CUDA graph is counted, not timed.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, Lease, StepObservation, Strategy
from services.tuner.arms import Arm, TunerConfigError
from services.tuner.bandit import BanditConfig, RateWindow, faster
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")
_KEYS = ("batch_size", "arm", "committed_tokens", "seconds", "steps", "explored")  # of an observation
_ALPHA = 0.05  # weight of a step in the best arm's moving throughput estimate


def resolve_clock(clock: str) -> str:
    """``"thread"`` or ``"engine"`` for a ``clock`` setting. Raises ``TunerConfigError`` for an unknown one."""
    if clock not in CLOCKS:
        raise TunerConfigError(f"StrategySelector: clock must be one of {CLOCKS}, got {clock!r}")
    if clock != "auto":
        return clock
    try:
        import torch  # optional here: without torch there is no accelerator either

        return "engine" if torch.cuda.is_available() else "thread"
    except ImportError:
        return "thread"


class _Account:
    """One bucket's regret budget: its time, exploration's extra time, the best arm's moving throughput."""

    __slots__ = ("time", "spent", "tokens", "seconds", "best")

    def __init__(self) -> None:
        self.time = self.spent = 0.0
        self.tokens = self.seconds = 0.0  # moving averages per step of the best arm (0: no estimate yet)
        self.best = ""  # the arm those averages are of

    def greedy(self, tokens: float, seconds: float) -> None:
        a = _ALPHA if self.seconds else 1.0
        self.tokens += a * (tokens - self.tokens)
        self.seconds += a * (seconds - self.seconds)


class StrategySelector:
    """Engine strategy selector over a tuner table (module docstring).

    Args:
        table: ``BucketedBandit.table()`` (possibly ``gate_table``-d).
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: rotates the order of equally played candidates, so actors probe different arms first.
        clock: ``"auto"``, ``"thread"`` or ``"engine"`` (module docstring).
        lease_steps: the longest lease, in steps; sample_every: every how many leased steps one is timed.

    Raises:
        TunerConfigError: unknown ``clock`` or a non-positive ``lease_steps`` / ``sample_every``.
    """

    def __init__(
        self,
        table: Mapping[str, Any],
        budgets: BudgetConfig | None = None,
        seed: int = 0,
        clock: str = "auto",
        lease_steps: int = 1024,
        sample_every: int = 64,
    ) -> None:
        if lease_steps < 1 or sample_every < 1:
            raise TunerConfigError("StrategySelector: lease_steps and sample_every must be >= 1")
        self.budgets = LengthBudgets(budgets or BudgetConfig())
        self.clock = resolve_clock(clock)
        self.seed = seed
        self.lease_steps, self.sample_every = lease_steps, sample_every
        self.lease: Lease | None = None
        self.choices: dict[str, int] = {}  # arm name -> steps (this actor, since the last drain)
        self._pending: list[dict[str, Any]] = []  # observations for the tuner
        self._accounts: dict[int, _Account] = {}
        self._last: tuple[int, Arm, bool, float] | None = None  # bucket, arm, explored, thread time at choose
        self._lease_bucket = 0
        self.update_table(table)

    # ------------------------------------------------------------------ table
    def update_table(self, table: Mapping[str, Any]) -> None:
        """Install a newer table (ends the lease; arms' play counts for candidate order restart)."""
        self._end_lease()
        old = getattr(self, "_rows", None)
        self.table = table  # the table this selector plays (read-only: install another with update_table)
        self.version = int(table["version"])
        self.regret_budget = float(table.get("regret_budget", 0.0))
        self.edges = list(table["bucket_edges"])
        self._arms = {n: Arm.from_dict(d) for n, d in table["arms"].items()}
        self._rows = list(table["buckets"])
        dflt = BanditConfig()
        self.window = int(table.get("window", dflt.window))
        self.min_samples = int(table.get("min_samples", dflt.min_samples))
        self.z = float(table.get("z", dflt.z))
        self._plays: dict[tuple[int, str], int] = {}
        self._own: dict[int, dict[str, RateWindow]] = {}  # bucket -> arm -> this selector's records
        # per bucket the arms that may be played: the best, the explore and probe lists (never guarded/gated)
        self._playable = [{r["best"], *r["explore"], *r["probe"]} for r in self._rows]
        if old is None or [r["lo"] for r in old] != [r["lo"] for r in self._rows]:
            self._accounts = {}

    def _bucket_of(self, n: int) -> int:
        return max(0, bisect.bisect_right(self.edges, n) - 1)

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses ``(problem_id, generated tokens)``: the per-problem length history (DAS)."""
        self.budgets.history.record_many(items)

    # ------------------------------------------------------------------ per step
    def _plan(self, i: int) -> tuple[str, list[str]]:
        """Bucket ``i``'s best arm and exploration candidates (module docstring, steps 0-1)."""
        row, own = self._rows[i], self._own.get(i)
        if not own:
            return row["best"], row["probe"] or row["explore"]
        ests = {n: tuple(e) for n, e in row.get("estimates", {}).items()}
        for n, w in own.items():
            e = w.estimate(self.min_samples)
            if e is not None:
                ests[n] = e
        playable = self._playable[i]
        best = row["best"]
        off = ests.get(OFF.name)
        if off is not None:
            quicker = [(e[0], n) for n, e in ests.items() if n in playable and faster(e, off, self.z)]
            best = max(quicker)[1] if quicker else OFF.name
        probe = [n for n in row["probe"] if n not in ests]
        return best, probe or [n for n in playable if n in ests and n != best]

    def _pick(self, i: int, acc: _Account) -> tuple[Arm, bool]:
        best_name, cands = self._plan(i)
        best = self._arms[best_name]
        if acc.best != best_name:  # another best: its throughput is unknown here
            acc.tokens = acc.seconds = 0.0
            acc.best = best_name
        if not acc.seconds or acc.spent > self.regret_budget * acc.time or not cands:
            return best, False
        k = len(cands)
        j = min(range(k), key=lambda j: (self._plays.get((i, cands[j]), 0), (j - self.seed) % k))
        self._plays[(i, cands[j])] = self._plays.get((i, cands[j]), 0) + 1
        return self._arms[cands[j]], True

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One ``Strategy`` per request for this step (module docstring)."""
        t0 = time.thread_time() if self.clock == "thread" else 0.0
        self._end_lease()
        n = len(requests)
        i = self._bucket_of(n)
        acc = self._accounts.setdefault(i, _Account())
        arm, explored = self._pick(i, acc)
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        self._last = (i, arm, explored, t0)
        if arm.is_off:
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
        """The result of the step ``choose`` just picked: recorded, charged to the budget; may grant a lease."""
        if self._last is None:
            return
        i, arm, explored, t0 = self._last
        self._last = None
        seconds = obs.seconds
        if self.clock == "thread":
            seconds = time.thread_time() - t0 or seconds
        if obs.capture_seconds > 0:  # a one-off graph capture: counted, not timed
            self._record(obs.batch_size, arm.name, 0, 0.0, 1, explored)
            return
        self._record(obs.batch_size, arm.name, obs.committed_tokens, seconds, 1, explored)
        self._own_record(i, arm.name, obs.committed_tokens, seconds)
        acc = self._accounts[i]
        acc.time += seconds
        if explored:
            acc.spent += max(0.0, seconds - obs.committed_tokens * acc.seconds / acc.tokens)
        else:
            acc.greedy(obs.committed_tokens, seconds)
            if arm.is_off:
                self._grant(i, acc)

    def _own_record(self, i: int, arm: str, tokens: float, seconds: float) -> None:
        if seconds > 0:
            own = self._own.setdefault(i, {})
            w = own.get(arm)
            if w is None:
                w = own[arm] = RateWindow(self.window)
            w.append(float(tokens), float(seconds))

    def _grant(self, i: int, acc: _Account) -> None:
        """Lease the bucket's next steps when nothing may be explored there before they are played."""
        row, budget = self._rows[i], self.regret_budget
        if self._plan(i)[1]:
            if budget <= 0:
                q = self.lease_steps
            else:
                q = math.ceil((acc.spent - budget * acc.time) / (budget * acc.seconds))
        else:
            q = self.lease_steps
        q = min(q, self.lease_steps)
        if q < 1:
            return
        hi = row["hi"]
        self.lease = Lease(q, row["lo"], math.inf if hi is None else hi, self.sample_every)
        self._lease_bucket = i

    def _end_lease(self) -> None:
        """Count the steps played under the lease (if any) in the bucket's time and report them, each timed
        sample carrying the steps since the previous one (the last, the rest); then end the lease."""
        lease, self.lease = self.lease, None
        if lease is None or lease.taken == 0:
            return
        i, played, lease.left = self._lease_bucket, lease.taken, 0
        self.choices[OFF.name] = self.choices.get(OFF.name, 0) + played
        acc, samples, prev = self._accounts[i], lease.samples or [None], 0
        for k, s in enumerate(samples):
            at = played if k == len(samples) - 1 else (k + 1) * self.sample_every  # Lease.take's rule
            tokens, seconds = (
                (0, 0.0) if s is None or s.capture_seconds > 0 else (s.committed_tokens, s.seconds)
            )
            if s is not None and self.clock == "thread" and s.thread_seconds > 0 and seconds:
                seconds = s.thread_seconds
            self._record(
                self._rows[i]["lo"] if s is None else s.batch_size, OFF.name, tokens, seconds, at - prev
            )
            if seconds:
                acc.greedy(tokens, seconds)
                self._own_record(i, OFF.name, tokens, seconds)
            prev = at
        acc.time += played * acc.seconds
        lease.samples.clear()

    def _record(self, b: int, arm: str, tokens: float, seconds: float, steps: int, explored=False) -> None:
        self._pending.append(dict(zip(_KEYS, (b, arm, tokens, seconds, steps, explored))))

    # ------------------------------------------------------------------ to the tuner
    def drain_observations(self) -> list[dict[str, Any]]:
        """The records since the last call (ends the lease), for ``BucketedBandit.merge``."""
        self._end_lease()
        out, self._pending = self._pending, []
        return out

    def drain_choices(self) -> dict[str, int]:
        """Steps per arm name since the last call (leased steps included; ends the lease)."""
        self._end_lease()
        out, self.choices = self.choices, {}
        return out
