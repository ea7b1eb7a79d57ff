"""The rollout actor's in-process strategy selector: the tuner's table, a regret budget, DAS draft budgets.

``StrategySelector`` implements the engine's ``StrategySelector`` protocol (``speculative/strategy.py``). Per
decode step, in the active batch size's bucket of its copy of the central table (``bandit.py``), it plays the
first candidate (a ``probe`` arm, rotated by the seed; else a longer chain of the best's drafter without its
own estimate, shortest first; else the ``explore`` arm with the highest ``R + z * se``) when the bucket's
*regret budget* pays for it, or a candidate whose expected extra time is nil (``_pick``; an arm with too few
records in the bucket costs nothing in expectation when its speed-up over off in the nearest bucket beats the
best's, and so does a longer chain of the best's drafter while the best's drafts are mostly accepted whole,
``_extra``); else the bucket's *best*: the table's, re-judged on estimates that continue the table's
windows with this selector's own steps (counterfactual records of the played arm's ``prefix_chains`` included,
``_counterfactual``): the table's best while it stays reliably faster than off, unless another arm's own steps
show it reliably faster than the best's own steps (switching on a point estimate chases noise, and the table's
windows hold other problems' steps); else the arm reliably faster than off with the highest lower bound, else
off. Draft lengths are capped by the length-aware budgets (``budgets.py``). *Lease*: when the best is off and
nothing may be explored, the engine plays the bucket's next steps plain without asking (``Lease``; every
``sample_every``-th timed).
*Seconds* (``clock``): ``"thread"``: the decoding thread's CPU time from ``choose`` to ``observe``;
``"engine"``: the engine's wall time (needed on CUDA); ``"auto"``: thread without CUDA, else engine. A step
that captured a CUDA graph is counted, not timed. docs/tuner.md gives the reasons.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.strategy import OFF, Lease, StepObservation, Strategy
from services.tuner.arms import Arm, Drafter, TunerConfigError
from services.tuner.bandit import BanditConfig, RateWindow, bucket_index, estimate_from_sums, faster, lower
from services.tuner.budgets import BudgetConfig, LengthBudgets
from services.tuner.step_cost import CostFit

CLOCKS = ("auto", "thread", "engine")
# drafters whose chain of k nodes is the first k nodes of their longer chain (a budget cuts the draft)
PREFIX_DRAFTERS = (Drafter.SUFFIX, Drafter.NGRAM)
_KEYS = ("batch_size", "arm", "committed_tokens", "seconds", "steps", "explored")  # of an observation
# A chain whose drafts were accepted whole in at least this share of its rows in a bucket under the current
# table (SATURATION_MIN_ROWS or more) is cut by its length more often than by a rejection: a longer chain of
# its drafter drafts the same first nodes and more, and is probed as free (``_extra``).
SATURATED = 0.5
SATURATION_MIN_ROWS = 8


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


def prefix_chains(arm: Arm, arms: Iterable[Arm]) -> list[Arm]:
    """The chains among ``arms`` that are prefixes of ``arm``'s drafts: of its drafter (one of
    ``PREFIX_DRAFTERS``), shorter than its chain, at most as deep as its tree (its first-child chain)."""
    k = arm.max_draft_tokens - 1 if arm.tree_width == 1 else arm.tree_depth
    same = [a for a in arms if a.drafter == arm.drafter and a.drafter in PREFIX_DRAFTERS]
    return [a for a in same if a.tree_width == 1 and a.max_draft_tokens <= k]


class _Account:
    """One bucket's regret account under the current table: its time, exploration's extra time (seconds), the
    seconds of its last step of the best, and per chain arm played its rows and rows accepted whole."""

    __slots__ = ("time", "spent", "step", "whole")

    def __init__(self) -> None:
        self.time = self.spent = self.step = 0.0
        self.whole: dict[str, list[int]] = {}  # arm name -> [rows accepted whole, rows]


class StrategySelector:
    """Engine strategy selector over a tuner table (module docstring).

    Args:
        table: ``BucketedBandit.table()`` (possibly ``gate_table``-d).
        budgets: per-class draft budgets and per-step quota (``BudgetConfig``).
        seed: rotates the order of the probes, so actors probe different arms first.
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
        self._last: tuple | None = None  # bucket, arm, explored, the best's rate, thread time at choose, cut
        self._lease_bucket = 0
        # bucket -> step seconds by verify width (``step_cost.py``; a property of the machine: kept across tables)
        self._costs: dict[int, CostFit] = {}
        self.update_table(table)

    def update_table(self, table: Mapping[str, Any]) -> None:
        """Install a newer table (ends the lease; own records and regret accounts start afresh: the table's
        ``allowance`` carries the budget over)."""
        self._end_lease()
        self.table = table  # read-only: install another with update_table
        self.version = int(table["version"])
        self.regret_budget = float(table.get("regret_budget", 0.0))
        self.edges = list(table["bucket_edges"])
        self._arms = {n: Arm.from_dict(d) for n, d in table["arms"].items()}
        # per arm, the chains its steps give counterfactual records to (once per table, not per step)
        self._prefixes = {n: prefix_chains(a, self._arms.values()) for n, a in self._arms.items()}
        self._rows = list(table["buckets"])
        dflt = BanditConfig()  # for a table without them (``StrategyTable.selector`` unset)
        self.window = int(table.get("window", dflt.window))
        self.min_samples = int(table.get("min_samples", dflt.min_samples))
        self.z = float(table.get("z", dflt.z))
        self._empty = RateWindow(self.window)
        self._own: dict[int, dict[str, RateWindow]] = {}  # bucket -> arm -> this selector's records
        self._accounts: dict[int, _Account] = {}
        self._speedups = self._nearest_speedups()

    def _nearest_speedups(self) -> list[dict[str, float]]:
        """Per bucket, each drafting arm's throughput over off's in the nearest bucket at or above it (itself
        first) where the table's windows give both an estimate, when it is reliably faster there: ``_extra``'s
        prior for an arm with too few records in a bucket. Never from a smaller bucket: a drafting arm's speed-up
        falls as the batch grows (the verify's compute grows with it, and the step quota cuts longer chains'
        drafts first), so a larger bucket's is a lower bound here and a smaller one's is not (trace replay at max
        batch 128 on a CPU: suffix-k4's 3.1x off at 64-95 active requests made it free at 96-191, where it ran
        1.6-1.8x plain against suffix-k16's 2.5x)."""
        ests = []
        for row in self._rows:
            sums = row.get("windows", {})
            ests.append(
                {n: e for n, w in sums.items() if (e := estimate_from_sums(w[0], w[1:], self.min_samples))}
            )
        out: list[dict[str, float]] = []
        for i in range(len(ests)):
            near, ratios = range(i, len(ests)), {}
            for name in (n for n, a in self._arms.items() if not a.is_off):
                j = next((j for j in near if name in ests[j] and OFF.name in ests[j]), None)
                if j is not None and faster(ests[j][name], ests[j][OFF.name], self.z):
                    ratios[name] = ests[j][name][0] / ests[j][OFF.name][0]
            out.append(ratios)
        return out

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses ``(problem_id, generated tokens)``: the per-problem length history (DAS)."""
        for problem_id, length in items:
            self.budgets.history.record(problem_id, length)

    def _next(self, i: int) -> tuple[str, list[str], float | None]:
        """Bucket ``i``'s best arm, the candidates to explore in order, and the best's throughput (tokens/s;
        None: no estimate yet) (module docstring)."""
        row, own = self._rows[i], self._own.get(i, {})
        ests = {}
        for n in dict.fromkeys([row["best"], *row["explore"], *row["probe"]]):  # never guarded nor gated
            if (e := self._estimate(i, n)) is not None:
                ests[n] = e
        best, contenders = row["best"], {row["best"], *own}  # an arm not played here keeps its place
        off = ests.get(OFF.name)
        if off is not None and len(contenders) > 1:
            quicker = [
                (lower(ests[n], self.z), n) for n in contenders if n in ests and faster(ests[n], off, self.z)
            ]
            if best in {n for _, n in quicker}:  # the table's best stays unless an arm is reliably faster
                # on this table's own records (the best's, once it has enough): the table's windows hold
                # records of other problems, whose drafts are accepted more or less
                fresh = {n: e for n in contenders if n in own and (e := own[n].estimate(self.min_samples))}
                base = fresh.get(best, ests[best])
                quicker = [
                    (fresh[n][0], n) for _, n in quicker if n in fresh and faster(fresh[n], base, self.z)
                ] or [(0.0, best)]
            best = max(quicker)[1] if quicker else OFF.name
        probe = [n for n in row["probe"] if n not in ests]
        k = self.seed % len(probe) if probe else 0
        covered = {a.name for a in self._prefixes[best]}  # their records come free

        def order(n: str) -> tuple[int, float]:
            # first a longer chain of the best's drafter without its own estimate: its steps judge the best too
            if len(own.get(n, ())) < self.min_samples and self._arms[best] in self._prefixes[n]:
                return 0, self._arms[n].max_draft_tokens
            return 1, -(ests[n][0] + self.z * ests[n][1])  # then the likeliest to beat the best

        explore = sorted((n for n in ests if n != best and n not in covered), key=order)
        return best, probe[k:] + probe[:k] + explore, ests[best][0] if best in ests else None

    def _saturated(self, best: str, name: str, acc: _Account) -> bool:
        """Whether ``name`` is a longer chain of chain ``best``'s drafter and ``best``'s drafts in this bucket
        were accepted whole in at least ``SATURATED`` of its rows (``SATURATION_MIN_ROWS`` or more; only chains'
        rows are counted, ``observe``)."""
        whole, rows = acc.whole.get(best, (0, 0))
        return (
            self._arms[name].tree_width == 1
            and self._arms[best] in self._prefixes[name]
            and rows >= SATURATION_MIN_ROWS
            and whole >= SATURATED * rows
        )

    def _extra(self, i: int, name: str, rate: float, acc: _Account, best: str) -> float:
        """A step of ``name``'s expected seconds beyond the best's for the same tokens, ``s * (1 - R / R_best)``
        from its mean step seconds ``s`` and throughput ``R`` (this selector's window, else the table's); one
        step of the best for an arm without either. An arm with fewer than ``min_samples`` records here whose
        speed-up over off in the nearest bucket with both estimates (``_nearest_speedups``: reliably faster
        there), times off's throughput here, beats the best's is expected to cost nothing: a bucket that gets
        few steps (the tail's single requests) could otherwise never afford the arms its neighbours show
        faster. So is a longer chain of the best's drafter with fewer than ``min_samples`` of this selector's own
        records while the best is saturated (``_saturated``): it commits at least the best's tokens (the table's
        records of it, of other problems, do not say how many more), and a regret budget of 0.5% of a bucket's
        time rarely pays for its probe."""
        w = self._own.get(i, {}).get(name)
        sums = w.sums() if w is not None else self._rows[i].get("windows", {}).get(name)
        if (w is None or len(w) < self.min_samples) and self._saturated(best, name, acc):
            return 0.0
        if not sums or sums[0] < self.min_samples:
            if speedup := self._speedups[i].get(name):
                if (est := self._estimate(i, OFF.name)) is not None and speedup * est[0] > rate:
                    return 0.0
        return acc.step if not sums or sums[2] <= 0 else (sums[2] - sums[1] / rate) / sums[0]

    def _owed(self, i: int, extra: float, acc: _Account) -> float:
        """Seconds by which a step of expected extra time ``extra`` would overdraw bucket ``i``'s regret budget
        (<= 0: it fits)."""
        # an earlier table's overdraft is not owed: carried, it would keep the bucket from re-trying stale
        # estimates for many rollouts (exploration stays within one table's budget per table)
        allowance = max(0.0, self._rows[i].get("allowance", 0.0))
        return acc.spent + extra - allowance - self.regret_budget * acc.time

    def _pick(
        self, i: int, best: str, cands: list[str], rate: float | None, acc: _Account
    ) -> tuple[str | None, float]:
        """The candidate to explore (None: none) and by how much the first would overdraw the budget (seconds):
        the first candidate when the budget pays for it, else the first whose expected extra is nil (it costs
        nothing in expectation, even from a spent budget, and its own steps correct a stale estimate). Nothing
        is explored before the best has an estimate and a step under this table."""
        if not rate or acc.step <= 0 or not cands:
            return None, math.inf
        extras = [self._extra(i, c, rate, acc, best) for c in cands]
        if (owed := self._owed(i, extras[0], acc)) <= 0:
            return cands[0], 0.0
        return next((c for c, e in zip(cands, extras) if e <= 0), None), owed

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One ``Strategy`` per request for this step (module docstring)."""
        t0 = time.thread_time() if self.clock == "thread" else 0.0
        self._end_lease()
        n = len(requests)
        i = bucket_index(self.edges, n)
        acc = self._accounts.setdefault(i, _Account())
        best, cands, rate = self._next(i)
        pick = self._pick(i, best, cands, rate, acc)[0]
        arm, explored = self._arms[pick or best], pick is not None
        self.choices[arm.name] = self.choices.get(arm.name, 0) + 1
        strategies, cut = self._strategies(arm, requests)
        self._last = (i, arm, explored, rate, t0, cut)
        return strategies

    def _strategies(self, arm: Arm, requests: list[DraftRequest]) -> tuple[list[Strategy], bool]:
        """Each request's strategy for ``arm``, its draft length capped by the length-aware budgets, and
        whether the step quota cut some request's draft (a shorter chain, under the same quota, would have
        drafted for it, so the step says nothing of that chain: ``_counterfactual``)."""
        n = len(requests)
        if arm.is_off:
            return [OFF] * n, False
        k, w, d = arm.max_draft_tokens, arm.tree_width, arm.tree_depth
        cfg = self.budgets.cfg
        if n * k <= cfg.step_quota and k <= min(cfg.long, cfg.medium, cfg.short):  # nothing is cut
            return [Strategy(str(arm.drafter), k, w, d)] * n, False
        alloc = self.budgets.allocate(
            [(r.request_id, r.problem_id, k, len(r.token_ids) - r.num_prompt_tokens) for r in requests]
        )
        cut = sum(alloc.values()) >= cfg.step_quota and min(alloc.values()) < k
        return [Strategy(str(arm.drafter), alloc[r.request_id], w, d) for r in requests], cut

    def observe(self, obs: StepObservation) -> None:
        """The result of the step ``choose`` just picked: recorded, charged to the budget; may grant a lease."""
        if self._last is None:
            return
        (i, arm, explored, rate, t0, cut), self._last = self._last, None
        seconds = (time.thread_time() - t0 or obs.seconds) if self.clock == "thread" else obs.seconds
        if obs.capture_seconds > 0:  # a one-off graph capture: counted, not timed
            self._record(i, obs.batch_size, arm.name, 0, 0.0, 1, explored)
            return
        self._record(i, obs.batch_size, arm.name, obs.committed_tokens, seconds, 1, explored)
        if seconds > 0:
            self._cost(i).add(obs.batch_size + sum(obs.draft_lengths), seconds)
        if not cut:
            self._counterfactual(i, arm, obs, seconds)
        acc = self._accounts[i]
        if obs.accepted_lengths and arm.tree_width == 1:
            whole = acc.whole.setdefault(arm.name, [0, 0])
            whole[0] += sum(a >= arm.max_draft_tokens for a in obs.accepted_lengths)
            whole[1] += len(obs.accepted_lengths)
        acc.time += seconds
        if explored:  # its extra time over the best's for the same tokens
            acc.spent += max(0.0, seconds - obs.committed_tokens / rate)
        else:
            acc.step = seconds
            if arm.is_off:
                self._grant(i, acc)

    def _counterfactual(self, i: int, arm: Arm, obs: StepObservation, seconds: float) -> None:
        """Own records (not for the tuner) of the played arm's ``prefix_chains`` from the same step: the chain of
        k nodes would have committed ``sum(min(accepted, k) + 1)`` tokens (``StepObservation.accepted_lengths``)
        in the step's seconds times the bucket's ``CostFit`` ratio of its verify width (drafts cut to k nodes) to
        the step's. Before the fit exists, times the two arms' ratio of mean step seconds in the table's windows
        (taken at other moments, with other draft lengths)."""
        if not obs.accepted_lengths or seconds <= 0 or not self._prefixes[arm.name]:
            return
        b, windows = obs.batch_size, self._rows[i].get("windows", {})
        played = windows.get(arm.name)
        fit = self._cost(i).line()
        step_cost = fit[0] + fit[1] * (b + sum(obs.draft_lengths)) if fit else 0.0
        for a in self._prefixes[arm.name]:
            k, ratio = a.max_draft_tokens, None
            if step_cost > 0:
                ratio = (fit[0] + fit[1] * (b + sum(min(d, k) for d in obs.draft_lengths))) / step_cost
            elif (w := windows.get(a.name)) and w[2] > 0 and played and played[2] > 0:
                ratio = (w[2] / w[0]) / (played[2] / played[0])
            if ratio is not None:
                tokens = b + sum(min(x, k) for x in obs.accepted_lengths)
                self._own_window(i, a.name).append(float(tokens), seconds * ratio)

    def _cost(self, i: int) -> CostFit:
        if i not in self._costs:
            self._costs[i] = CostFit()
        return self._costs[i]

    def _grant(self, i: int, acc: _Account) -> None:
        """Lease the bucket's next steps when nothing may be explored there before they are played: as many as
        the budget needs to afford the first candidate (``lease_steps`` when there is none)."""
        best, cands, rate = self._next(i)
        pick, owed = self._pick(i, best, cands, rate, acc)
        if not cands or self.regret_budget <= 0:
            q = self.lease_steps
        elif not rate or pick is not None:
            return  # the best needs its estimate first, or a candidate may be explored now: no lease
        else:
            q = min(self.lease_steps, math.ceil(owed / (self.regret_budget * acc.step)))
        row = self._rows[i]
        self.lease = Lease(q, row["lo"], math.inf if row["hi"] is None else row["hi"], self.sample_every)
        self._lease_bucket = i

    def _end_lease(self) -> None:
        """Count the steps played under the lease (if any) in the bucket's time and report them, each timed
        sample carrying the steps since the previous one (the last, the rest); then end the lease."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.left = 0  # the engine drops it too
        if lease is None or not lease.taken:
            return
        i, played, samples = self._lease_bucket, lease.taken, lease.samples or [None]
        self.choices[OFF.name] = self.choices.get(OFF.name, 0) + played
        acc, last = self._accounts[i], len(samples) - 1
        for k, s in enumerate(samples):  # sample k was timed at step (k + 1) * sample_every (Lease.take)
            steps = played - k * self.sample_every if k == last else self.sample_every
            timed = s is not None and s.capture_seconds <= 0
            tokens, seconds = (s.committed_tokens, s.seconds) if timed else (0, 0.0)
            if timed and self.clock == "thread" and s.thread_seconds > 0:
                seconds = s.thread_seconds
            b = s.batch_size if s is not None else self._rows[i]["lo"]
            self._record(i, b, OFF.name, tokens, seconds, steps)
            if seconds > 0:
                self._cost(i).add(b, seconds)
            acc.step = seconds or acc.step
        acc.time += played * acc.step
        lease.samples.clear()

    def _record(self, i: int, b: int, arm: str, tokens: float, seconds: float, steps: int, explored=False):
        """An observation for the tuner; a timed one also goes into this selector's own window of the arm."""
        self._pending.append(dict(zip(_KEYS, (b, arm, tokens, seconds, steps, explored))))
        if seconds > 0:
            self._own_window(i, arm).append(float(tokens), seconds)

    def _estimate(self, i: int, arm: str) -> tuple[float, float] | None:
        """``arm``'s (R, se) in bucket ``i``: this selector's own records continuing the table's window."""
        own = self._own.get(i, {}).get(arm, self._empty)
        return own.estimate(self.min_samples, self._rows[i].get("windows", {}).get(arm))

    def _own_window(self, i: int, arm: str) -> RateWindow:
        own = self._own.setdefault(i, {})
        if arm not in own:
            own[arm] = RateWindow(self.window)
        return own[arm]

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
