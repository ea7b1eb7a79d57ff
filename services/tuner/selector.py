"""The rollout actor's in-process strategy selector: the tuner's table, a regret budget, DAS draft budgets.

``StrategySelector`` implements the engine's ``StrategySelector`` protocol (``speculative/strategy.py``). Per
decode step it finds the active batch size's bucket in its copy of the central table (``bandit.py``) and plays
(docs/tuner.md, "The selector", gives the reasons):

1. an exploration step, when the bucket's *regret budget* can pay for it: exploration's extra time over the
   best, ``sum(max(0, seconds - tokens / R_best))``, plus the step's expected extra (``_extra``), at most
   ``regret_budget`` of the bucket's time under this table. The candidate: a ``probe`` arm (rotated by the
   seed), else the ``explore`` arm with the highest ``R + z * se``;
2. else the bucket's *best*: the table's rule re-judged on estimates that continue the table's windows with
   this selector's own steps (``RateWindow.estimate(prior=...)``), among the table's best and the arms it has
   played. Each drafting request's draft length is capped by the length-aware budgets (``budgets.py``).

*Lease*: when the best is off and nothing may be explored, the engine plays the bucket's next steps plain
without asking (``Lease``; every ``sample_every``-th timed), reported at the next step it asks about.
*Seconds* (``clock``): ``"thread"``: the decoding thread's CPU time from ``choose`` to ``observe`` (a busy
neighbour does not look like a slow arm); ``"engine"``: the engine's wall time (needed on CUDA); ``"auto"``:
thread without CUDA, else engine. A step that captured a CUDA graph is counted, not timed.
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
    """One bucket's regret budget: its time, exploration's extra time, the seconds of its last best step."""

    __slots__ = ("time", "spent", "step")

    def __init__(self) -> None:
        self.time = self.spent = self.step = 0.0


class StrategySelector:
    """Engine strategy selector over a tuner table (module docstring).

    Args:
        table: ``BucketedBandit.table()`` (possibly ``gate_table``-d).
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: rotates the order of the probes, so that actors probe different arms first.
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
        self._last: tuple | None = None  # bucket, arm, explored, best's throughput, thread time at choose
        self._lease_bucket = 0
        self.update_table(table)

    def update_table(self, table: Mapping[str, Any]) -> None:
        """Install a newer table (ends the lease; own records and regret budgets start afresh)."""
        self._end_lease()
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
        self._own: dict[int, dict[str, RateWindow]] = {}  # bucket -> arm -> this selector's records
        # per bucket the arms that may be played: the best, the explore and probe lists (never guarded/gated)
        self._playable = [list(dict.fromkeys([r["best"], *r["explore"], *r["probe"]])) for r in self._rows]
        self._accounts: dict[int, _Account] = {}  # each table's (rollout's) exploration has its own budget

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses ``(problem_id, generated tokens)``: the per-problem length history (DAS)."""
        self.budgets.history.record_many(items)

    # ------------------------------------------------------------------ per step
    def _next(self, i: int) -> tuple[str, str | None, float | None]:
        """Bucket ``i``'s best arm, the candidate to explore next (None: none) and the best's throughput in
        tokens/s (None: no estimate yet, and nothing is explored) (module docstring)."""
        row, own, prior = self._rows[i], self._own.get(i, {}), self._rows[i].get("windows", {})
        empty = RateWindow(self.window)
        ests = {n: own.get(n, empty).estimate(self.min_samples, prior.get(n)) for n in self._playable[i]}
        ests = {n: e for n, e in ests.items() if e is not None}
        best, off = row["best"], ests.get(OFF.name)
        if off is not None and set(own) - {best}:  # an arm not played here does not displace the table's best
            quicker = [(ests[n][0], n) for n in {best, *own} if n in ests and faster(ests[n], off, self.z)]
            best = max(quicker)[1] if quicker else OFF.name
        rate = ests[best][0] if best in ests else None
        probe = [n for n in row["probe"] if n not in ests]
        if probe:
            return best, probe[self.seed % len(probe)], rate
        explore = [n for n in ests if n != best]
        return best, max(explore, key=lambda n: ests[n][0] + self.z * ests[n][1], default=None), rate

    def _extra(self, i: int, name: str, rate: float, acc: _Account) -> float:
        """A step of arm ``name``'s expected seconds beyond the best's for the same tokens: ``s * (1 - R /
        R_best)`` from its mean step seconds ``s`` and throughput ``R`` here (this selector's window, else the
        table's). For an arm without either, the same from the nearest bucket where the table has both arms,
        as ratios to the best's: ``acc.step * q * (1 - r)``, ``q`` the ratio of mean step seconds and ``r`` of
        throughputs there; one step of the best's (``acc.step``) where no bucket has both."""
        w = self._own.get(i, {}).get(name)
        rows = self._rows
        sums = w.sums() if w is not None and len(w) else rows[i].get("windows", {}).get(name)
        if sums and sums[0] > 0 and sums[2] > 0:
            return max(0.0, sums[2] / sums[0] - sums[1] / sums[0] / rate)
        for j in sorted(range(len(rows)), key=lambda j: (abs(j - i), j))[1:]:
            win = rows[j].get("windows", {})
            a, b = win.get(name), win.get(rows[i]["best"])
            if a and b:  # [n, sum tokens, sum seconds, ...] of arms with an estimate there
                q, r = (a[2] / a[0]) / (b[2] / b[0]), (a[1] / a[2]) / (b[1] / b[2])
                return acc.step * q * max(0.0, 1.0 - r)
        return acc.step

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One ``Strategy`` per request for this step (module docstring)."""
        t0 = time.thread_time() if self.clock == "thread" else 0.0
        self._end_lease()
        n = len(requests)
        i = max(0, bisect.bisect_right(self.edges, n) - 1)
        acc = self._accounts.setdefault(i, _Account())
        best, cand, rate = self._next(i)
        # explore only a step the budget can pay for, and only after a step of the best in this table
        explored = bool(cand is not None and rate and acc.step > 0)
        explored = explored and acc.spent + self._extra(i, cand, rate, acc) <= self.regret_budget * acc.time
        arm = self._arms[cand if explored else best]
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        self._last = (i, arm, explored, rate, t0)
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
        (i, arm, explored, rate, t0), self._last = self._last, None
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
        if explored:  # its extra time over the best's for the same tokens
            acc.spent += max(0.0, seconds - obs.committed_tokens / rate)
        else:
            acc.step = seconds
            if arm.is_off:
                self._grant(i, acc)

    def _own_record(self, i: int, arm: str, tokens: float, seconds: float) -> None:
        if seconds > 0:
            own = self._own.setdefault(i, {})
            own.setdefault(arm, RateWindow(self.window)).append(float(tokens), float(seconds))

    def _grant(self, i: int, acc: _Account) -> None:
        """Lease the bucket's next steps when nothing may be explored there before they are played: as many as
        the budget needs to afford the next exploration (``lease_steps`` when there is none)."""
        row, budget = self._rows[i], self.regret_budget
        _, cand, rate = self._next(i)
        if cand is None or budget <= 0:
            q = self.lease_steps
        elif not rate:
            return  # the best needs its estimate before anything is explored: no lease
        else:
            owed = acc.spent + self._extra(i, cand, rate, acc) - budget * acc.time
            q = min(self.lease_steps, math.ceil(owed / (budget * acc.step)))
        if q >= 1:
            hi = math.inf if row["hi"] is None else row["hi"]
            self.lease, self._lease_bucket = Lease(q, row["lo"], hi, self.sample_every), i

    def _end_lease(self) -> None:
        """Count the steps played under the lease (if any) in the bucket's time and report them, each timed
        sample carrying the steps since the previous one (the last, the rest); then end the lease."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        i, played, lease.left = self._lease_bucket, lease.taken, 0  # left = 0: the engine drops it too
        if played == 0:
            return
        self.choices[OFF.name] = self.choices.get(OFF.name, 0) + played
        acc, samples, prev = self._accounts[i], lease.samples or [None], 0
        for k, s in enumerate(samples):
            at = played if k == len(samples) - 1 else (k + 1) * self.sample_every  # Lease.take's rule
            tokens, seconds = (
                (0, 0.0) if s is None or s.capture_seconds > 0 else (s.committed_tokens, s.seconds)
            )
            if seconds and self.clock == "thread" and s.thread_seconds > 0:
                seconds = s.thread_seconds
            self._record(
                self._rows[i]["lo"] if s is None else s.batch_size, OFF.name, tokens, seconds, at - prev
            )
            if seconds:
                acc.step = seconds
                self._own_record(i, OFF.name, tokens, seconds)
            prev = at
        acc.time += played * acc.step
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
