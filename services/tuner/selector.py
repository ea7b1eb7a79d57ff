"""The rollout actor's in-process strategy selector: the tuner's table, a regret budget, DAS draft budgets.

``StrategySelector`` implements the engine's ``StrategySelector`` protocol (``speculative/strategy.py``). Per
decode step it finds the active batch size's bucket in its copy of the central table (``bandit.py``) and
plays (docs/tuner.md, "The selector", gives the reasons):

0. the bucket's *best*: the table's rule re-judged on estimates that continue the central windows with this
   selector's own steps since the table arrived (``RateWindow.estimate(prior=...)``), among the table's best
   and the arms it has played. A step of the suffix or n-gram drafter also gives *counterfactual records* to
   that drafter's shorter chains (``prefix_chains``): the chain of k nodes would have committed
   ``sum(min(accepted, k) + 1)`` tokens (``StepObservation.accepted_lengths``), in the step's seconds times
   the two arms' ratio of mean step seconds in the table; those chains are never explored while it plays;
1. when the bucket's *regret budget* can pay for the step (exploration's extra time over the best,
   ``sum(max(0, seconds - tokens / R_best))``, plus the step's expected extra (``_extra``), at most the
   table's ``allowance`` (an overdrawn one counts as 0) plus ``regret_budget`` of the bucket's time under this
   table), or the step's expected extra is nil (then it costs nothing in expectation): the first candidate
   (a ``probe`` arm, rotated by the seed; else, while it has fewer than ``min_samples`` steps under this
   table, the shortest chain of the best's drafter longer than the best, whose steps judge the best too; else
   the ``explore`` arm with the highest ``R + z * se``), or
   one whose expected extra is nil: a probe of an adjacent bucket's best, and, while the best is off, an
   explore arm whose estimate is at least off's (a stale tie is re-tried at once while a probe's budget
   accrues);
2. else the best. Each drafting request's draft length is capped by the length-aware budgets (``budgets.py``).

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
from services.tuner.arms import Arm, Drafter, TunerConfigError
from services.tuner.bandit import BanditConfig, RateWindow, estimate_from_sums, faster
from services.tuner.budgets import BudgetConfig, LengthBudgets

CLOCKS = ("auto", "thread", "engine")
# drafters whose chain of k nodes is the first k nodes of their longer chain (a budget cuts the draft)
PREFIX_DRAFTERS = (Drafter.SUFFIX, Drafter.NGRAM)
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


def prefix_chains(arm: Arm, arms: list[Arm]) -> list[Arm]:
    """The chains among ``arms`` that are prefixes of ``arm``'s drafts: of its drafter, shorter than a chain,
    at most as deep as a tree (its first-child chain). None unless the drafter is in ``PREFIX_DRAFTERS``."""
    if arm.drafter not in PREFIX_DRAFTERS:
        return []
    k = arm.max_draft_tokens - 1 if arm.tree_width == 1 else arm.tree_depth
    return [a for a in arms if a.drafter == arm.drafter and a.tree_width == 1 and a.max_draft_tokens <= k]


class _Account:
    """One bucket's regret account under the current table (the table's ``allowance`` holds the earlier ones): its
    time, exploration's extra time, the seconds of its last best step."""

    __slots__ = ("time", "spent", "step")

    def __init__(self) -> None:
        self.time = self.spent = self.step = 0.0


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
        self._last: tuple[int, Arm, bool, float] | None = None  # bucket, arm, explored, thread time at choose
        self._lease_bucket = 0
        self.update_table(table)

    # ------------------------------------------------------------------ table
    def update_table(self, table: Mapping[str, Any]) -> None:
        """Install a newer table (ends the lease; own records and regret accounts start afresh: the table's
        ``allowance`` carries the budget over)."""
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
        # per bucket, per playable arm: the playable chains its steps give counterfactual records to
        self._prefixes = [
            {n: prefix_chains(self._arms[n], [self._arms[m] for m in names]) for n in names}
            for names in self._playable
        ]
        # per bucket, per playable arm: the names of those chains
        self._covers = [{n: {a.name for a in p} for n, p in pre.items()} for pre in self._prefixes]
        self._accounts: dict[int, _Account] = {}  # this table's (earlier: the allowance)

    def _bucket_of(self, n: int) -> int:
        return max(0, bisect.bisect_right(self.edges, n) - 1)

    def record_lengths(self, items: list[tuple[str, int]]) -> None:
        """Finished responses ``(problem_id, generated tokens)``: the per-problem length history (DAS)."""
        self.budgets.history.record_many(items)

    # ------------------------------------------------------------------ per step
    def _next(self, i: int) -> tuple[str, list[str], float | None]:
        """Bucket ``i``'s best arm, the candidates to explore in order of preference, and the best's throughput
        estimate (tokens/s; None: none yet, and nothing is explored) (module docstring, steps 0-1): the probes
        rotated by the seed (actors probe different arms first), then the explorations by upper bound."""
        row, own = self._rows[i], self._own.get(i, {})
        prior = row.get("windows", {})
        best, playable = row["best"], self._playable[i]
        ests = {}
        for n in playable:
            w = own.get(n)
            e = (
                w.estimate(self.min_samples, prior.get(n))
                if w is not None
                else self._prior_estimate(prior, n)
            )
            if e is not None:
                ests[n] = e
        contenders = {best, *own}  # an arm this selector has not played does not displace the table's best
        off = ests.get(OFF.name)
        if off is not None and len(contenders) > 1:
            quicker = [(ests[n][0], n) for n in contenders if n in ests and faster(ests[n], off, self.z)]
            best = max(quicker)[1] if quicker else OFF.name
        probe = [n for n in row["probe"] if n not in ests]
        probe = probe[self.seed % len(probe) :] + probe[: self.seed % len(probe)] if probe else []
        covered = self._covers[i].get(best, set())  # their records come free
        explore = [n for n in playable if n in ests and n != best and n not in covered]
        # first the shortest chain longer than the best of its drafter, until it has its own estimate: its steps
        # judge the best as well (counterfactual records), so one exploration refreshes the drafter's chains
        # where the table's estimates are stale; then the likeliest to beat the best
        up = {n for n in explore if best in self._covers[i][n] and len(own.get(n, ())) < self.min_samples}
        explore.sort(
            key=lambda n: (
                (0, self._arms[n].max_draft_tokens) if n in up else (1, -(ests[n][0] + self.z * ests[n][1]))
            )
        )
        return best, probe + explore, ests[best][0] if best in ests else None

    def _prior_estimate(self, prior: Mapping[str, list[float]], arm: str) -> tuple[float, float] | None:
        """The table's estimate of ``arm`` from its window sums (``prior``: the row's ``windows``)."""
        w = prior.get(arm)
        return estimate_from_sums(w[0], w[1:], self.min_samples) if w is not None else None

    def _eligible(self, i: int, best: str, cands: list[str], rate: float, acc: _Account) -> list[str]:
        """Of ``_next``'s candidates, those this step may explore if the budget pays: the first (a probe before
        any exploration), then any whose expected extra time is nil (``_extra``): a probe of an adjacent
        bucket's best and, while the best is off, a drafting arm whose estimate is at least off's (evidence
        from when its drafts did not pay, re-tried at once)."""
        probe = self._rows[i]["probe"]
        free = [
            c for c in cands[1:] if (best == OFF.name or c in probe) and self._extra(i, c, rate, acc) <= 0
        ]
        return cands[:1] + free

    def _pick(self, i: int, acc: _Account) -> tuple[Arm, bool, float | None]:
        """Bucket ``i``'s next arm, whether it explores, and the best's throughput (module docstring): the first
        eligible candidate the budget can pay for, else the best; nothing is explored before a step of the
        best in this table."""
        best, cands, rate = self._next(i)
        if rate and acc.step > 0:
            for cand in self._eligible(i, best, cands, rate, acc):
                if self._affordable(i, cand, rate, acc):
                    return self._arms[cand], True, rate
        return self._arms[best], False, rate

    def _affordable(self, i: int, name: str, rate: float, acc: _Account) -> bool:
        """Whether a step of ``name`` may be explored now: its expected extra time is nil (it costs the budget
        nothing in expectation, and its own steps correct a stale estimate: an overdrawn budget, such as one
        spent on evidence gathered before the drafts paid, does not keep it from being played) or it fits
        the budget (``_owed``)."""
        extra = self._extra(i, name, rate, acc)
        return extra <= 0 or self._owed(i, extra, acc) <= 0

    def _owed(self, i: int, extra: float, acc: _Account) -> float:
        """Seconds by which a step of expected extra time ``extra`` (``_extra``) would overdraw bucket ``i``'s
        regret budget (<= 0: it fits)."""
        # an earlier table's overdraft is not owed: carried, it would keep the bucket from re-trying stale
        # estimates for many rollouts (its exploration regret stays within one table's budget per table)
        allowance = max(0.0, self._rows[i].get("allowance", 0.0))
        return acc.spent + extra - allowance - self.regret_budget * acc.time

    def _extra(self, i: int, name: str, rate: float, acc: _Account) -> float:
        """A step of arm ``name``'s expected seconds beyond the best's for the same tokens, ``s * (1 - R /
        R_best)`` from its mean step seconds ``s`` and throughput ``R`` (this selector's window, else the
        table's); for an arm without any: one step of the best's (``acc.step``), or nil when it is an
        adjacent bucket's best (the batch sizes next to this one find it faster)."""
        w = self._own.get(i, {}).get(name)
        sums = w.sums() if w is not None and len(w) else self._rows[i].get("windows", {}).get(name)
        if not sums or sums[0] <= 0 or sums[2] <= 0:
            near = self._rows[max(0, i - 1) : i + 2]
            return 0.0 if name != OFF.name and any(r["best"] == name for r in near) else acc.step
        return max(0.0, sums[2] / sums[0] - sums[1] / sums[0] / rate)

    def choose(self, requests: list[DraftRequest]) -> list[Strategy]:
        """One ``Strategy`` per request for this step (module docstring)."""
        t0 = time.thread_time() if self.clock == "thread" else 0.0
        self._end_lease()
        n = len(requests)
        i = self._bucket_of(n)
        acc = self._accounts.setdefault(i, _Account())
        arm, explored, rate = self._pick(i, acc)
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
        i, arm, explored, rate, t0 = self._last
        self._last = None
        seconds = obs.seconds
        if self.clock == "thread":
            seconds = time.thread_time() - t0 or seconds
        if obs.capture_seconds > 0:  # a one-off graph capture: counted, not timed
            self._record(obs.batch_size, arm.name, 0, 0.0, 1, explored)
            return
        self._record(obs.batch_size, arm.name, obs.committed_tokens, seconds, 1, explored)
        self._own_record(i, arm.name, obs.committed_tokens, seconds)
        self._counterfactual(i, arm, obs, seconds)
        acc = self._accounts[i]
        acc.time += seconds
        if explored:  # its extra time over the best's for the same tokens
            acc.spent += max(0.0, seconds - obs.committed_tokens / rate)
        else:
            acc.step = seconds
            if arm.is_off:
                self._grant(i, acc)

    def _counterfactual(self, i: int, arm: Arm, obs: StepObservation, seconds: float) -> None:
        """Records for ``prefix_chains`` of the played arm from the same step (module docstring, step 0): a chain of k nodes
        is the first k nodes of the played draft's first-child chain, so it would have committed
        ``sum(min(accepted, k) + 1)`` tokens; its seconds are the step's times the ratio of the two arms' mean
        step seconds in the table's windows of this bucket (an arm without one gets no record)."""
        shorter = self._prefixes[i].get(arm.name, ())
        windows = self._rows[i].get("windows", {})
        played = windows.get(arm.name)
        if not shorter or not obs.accepted_lengths or not played or played[2] <= 0:
            return
        for a in shorter:
            w = windows.get(a.name)
            if w and w[2] > 0 and w[0] > 0:
                k = a.max_draft_tokens
                tokens = obs.batch_size + sum(min(x, k) for x in obs.accepted_lengths)
                self._own_record(i, a.name, tokens, seconds * (w[2] / w[0]) / (played[2] / played[0]))

    def _own_record(self, i: int, arm: str, tokens: float, seconds: float) -> None:
        if seconds > 0:
            own = self._own.setdefault(i, {})
            w = own.get(arm)
            if w is None:
                w = own[arm] = RateWindow(self.window)
            w.append(float(tokens), float(seconds))

    def _grant(self, i: int, acc: _Account) -> None:
        """Lease the bucket's next steps when nothing may be explored there before they are played: as many as
        the budget needs to afford an eligible candidate (``lease_steps`` when there is none)."""
        row, budget = self._rows[i], self.regret_budget
        best, cands, rate = self._next(i)
        if not cands or budget <= 0:
            q = self.lease_steps
        elif not rate:
            return  # the best needs its estimate before anything is explored: no lease
        else:
            extras = [self._extra(i, c, rate, acc) for c in self._eligible(i, best, cands, rate, acc)]
            owed = [self._owed(i, e, acc) for e in extras]
            if any(e <= 0 or o <= 0 for e, o in zip(extras, owed)):  # _affordable
                return
            q = min(self.lease_steps, math.ceil(min(owed) / (budget * acc.step)))
        if q < 1:
            return
        hi = row["hi"]
        self.lease = Lease(q, row["lo"], math.inf if hi is None else hi, self.sample_every)
        self._lease_bucket = i

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
            if s is not None and self.clock == "thread" and s.thread_seconds > 0 and seconds:
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
