"""Bucketed epsilon-greedy bandit over strategies (arms), with a regret guard against plain decoding.

After TLT's BEG-MAB (arXiv 2511.16665, "Taming the Long Tail"): decode steps are grouped into buckets by
the *active batch size*, because the best speculation strategy depends on it (deep drafts pay off when the
batch is small and decoding is memory-bound; at large batches verification compute dominates and plain
decoding wins). Each bucket runs its own bandit over the same arm list.

Contract
--------
- ``bucket_of(b)``: bucket ``i`` holds batch sizes ``bucket_edges[i] <= b < bucket_edges[i + 1]`` (the last
  bucket is open-ended; sizes below the first edge go to bucket 0).
- Reward of one decode step = committed tokens per second = (accepted draft tokens + bonus/correction
  tokens, summed over the batch) / (seconds of draft + verify). Higher is better. ``off`` commits one
  token per request per step. The seconds are whatever the caller measured: the rollout actor's
  ``TunedStrategyPolicy`` (``policy.py``) reports the decoding thread's CPU time on a CPU-only machine (other
  processes' load does not leak into the reward) and the engine's wall time otherwise.
- Per bucket and arm a sliding window of the last ``window`` (64) steps is kept, for ``off`` of the last
  ``off_window`` (``8 * window``). The arm's *estimate* is its
  throughput over the window, sum(tokens) / sum(seconds), with each step's seconds capped at ``stall_cap``
  (2) times the window's median step seconds (``estimator="capped"``, the default: a stall such as a GC
  pause or a preempted core counts as a normal slow step, not as a 100x one); the plain ratio (``"ratio"``:
  one stall skews it); that ratio without the ``trim`` fraction of slowest and fastest steps by rate
  (``"trimmed"``); or the window median of per-step rewards (``"median"``). Why off keeps more: it is the
  greedy arm almost everywhere and gets most steps, so 64 of its steps are a recent slice (at batch 1: part
  of one response, whose context length sets the step cost), while an explored arm's 64 steps span many
  rollouts; the two estimates then describe different conditions, and at batch 1 off's slice of a long
  response made drafting arms look ~10% better than they were when played (three rollouts in a row on a
  slower drafting arm, 0.84x plain). Off's speed does not change with drafter versions, so its longer
  memory costs no adaptation; drafting arms keep the short window. The median is robust to stalls
  but biased against drafting arms: their per-step rewards are skewed (most steps commit one token per
  request at a slightly higher cost, a few commit many), so the typical step is slower than off while the
  throughput is higher. Measured on the default policy at batch 1 (suffix-k8 vs off): median 264 vs 309
  tokens per CPU-second, throughput 284 vs 298; i.e. the median understates drafting arms by ~10% relative
  to off.
- ``choose(b)``: (1) an arm that is not guarded and is untried (nor guarded in a bucket of smaller batch
  sizes: drafts only get costlier as the batch grows, ``_forced``), on probation (see the guard), or has fewer
  than ``min_samples_for_best`` (4) samples in this bucket's window while one of them came within
  ``guard_margin`` of off's estimate (under-sampled but promising) is played first, least-played first,
  config order on ties (a rollout actor's ``TablePolicy`` plays each such arm once per table version); (2) else
  an *eligible* arm a other than the current best with probability ``explore_p(a)`` (exploration, see below);
  (3) else the greedy arm: off, unless an eligible arm with at least
  ``min_samples_for_best`` samples is *reliably* better than off, i.e. its estimate minus ``best_z`` (1)
  standard errors of its throughput (the throughput guard's standard error, floored at
  ``guard_cv_floor * R / sqrt(n)``) still beats off's estimate, both taken over the period the two windows
  share when off has at least ``min_samples_for_guard`` steps in it (``_common_period``: off's recent slice
  and an explored arm's rollouts-long window describe different conditions); among those, the best estimate
  (config order on ties). Eligible = has samples, not guarded, not on probation. ``off`` is always an arm and never guarded, so there is always an eligible arm. The minimum
  keeps a drafting arm whose single sample happened to be a long accept from becoming the greedy choice:
  rollout actors play the table's best for a whole rollout before the next table arrives, so a best chosen
  on thin evidence costs a rollout (measured: after one cold rollout at batch 16, one probe per arm, the
  table's best was a suffix arm, 1.5x slower than off there). The pessimistic ranking does the same for the
  winner's curse: with five drafting arms of 4..20 samples each, the largest point estimate is usually an
  arm that got lucky, and taking it as the best flipped the batch-1 bucket between three drafting arms that
  were all slower than off (a whole rollout on each, 0.88x plain); a challenger now has to beat off by about
  one standard error (~6% with a full window of drafting steps, ~25% with four samples); between arms that
  do, the point estimates decide.
- ``observe(b, arm, committed_tokens, seconds)``: one decode step's result.

Exploration with a regret budget
--------------------------------
Plain epsilon-greedy spends ``epsilon`` of the steps on the other arms whatever they cost. Where they are
near-ties (batch 1 on the default policy: suffix and n-gram arms within ~10% of each other) that is the price
of tracking the best; where they are clearly worse (batch >= 16: a drafting step costs 1.5-2x an ``off`` step
for ~1.35 tokens per request) it was a fixed ~3-5% of the bucket's time, measured on the long-tail benchmark.
So each arm gets ``epsilon / n``, capped by its share of ``explore_regret_budget`` (B), where n is the number
of arms other than the best, guarded ones included (a guarded arm's share is not handed to the others: with
four of five drafting arms guarded at batch 64, the fifth would otherwise be explored at the whole epsilon,
10% of the steps, for a rollout):

    explore_p(a) = min(epsilon / n, B / (n * c_a)),   c_a = estimate(best) / estimate(a) - 1

c_a is the extra time per committed token of a over the best (0.5: a's tokens take 1.5x as long), so the
expected extra time of exploration, sum_a explore_p(a) * c_a, is at most B (default 1%) of the bucket's time,
and an arm as good as the best (c_a <= 0) keeps the full ``epsilon / n``. An arm with fewer than
``min_samples_for_guard`` samples has no estimate to price it by; c_a is then a pessimistic floor,
``estimate(off) / (estimate(a) + guard_z * se(a)) - 1`` (0 when negative), the largest over this bucket and
every bucket of smaller batch sizes where a has at least ``fast_guard_samples`` (2) samples and off at least
``min_samples_for_guard`` (a floor from a single sample, with se = the ``guard_cv_floor`` prior 0.5 R, kept a
bad arm at its first sample, so never guarded: explored at its priced rate for good; simulated, the
evidence phase was cheaper but the steady state 0.8% slower): a draft only gets costlier as the batch grows, so an arm that surely costs 50% more
than off at batch 4 costs at least that at batch 64 (``_cost_floor``). An arm with no such evidence keeps the
full share (the guard needs samples). Before the floor, the evidence phase cost: each of the eight drafting
arms (learned ones included) was explored at ``epsilon / n`` in every large bucket until it had six samples
there, about six rollouts at ~1 play per arm and rollout, each play 2-3 off steps at batch 64; measured
regret vs always-off on the long-tail benchmark's rollouts 3-6 (step logs, batch 16 and 64): 6-8% of the
rollout's decode time, 3.5-6% with the floor; on a simulated 64 -> 1 rollout with the default arms, rollouts
3-8 at 0.922 of off's speed before, 0.962 after. ``explore_regret_budget = None`` gives plain epsilon-greedy.
The guard below still removes arms that are reliably worse than ``off``; the budget prices the rest.

Regret guard ("reliably below off")
-----------------------------------
Nothing is guarded in a bucket until ``off`` has ``min_samples_for_guard`` (k) samples there. Then an arm
``a != off`` becomes *guarded* in that bucket when

- ``guard_rule="throughput"`` (default): a has >= k samples and the upper confidence bound of its
  throughput, ``R + z * se(R)``, is below ``(1 - guard_margin) * estimate(off)``; R = sum(tokens) /
  sum(capped seconds) of a's window (as the ``capped`` estimate) and se(R) its delta-method standard error
  ``sqrt(sum((tokens_i - R * seconds_i)**2) / (n (n - 1))) / mean(seconds)``, at least
  ``guard_cv_floor * R / sqrt(n)`` (``z = guard_z``). The test is about throughput, like the estimate, so an
  arm whose typical step is slower than off but whose throughput is not (a drafting arm: many one-token
  steps, a few long accepts) is not guarded. The floor is a prior on how variable a drafting arm's steps
  are (0.5: a suffix arm at batch 1 drafts in ~1 step in 6): six one-token steps in a row are no proof that
  the long accepts never come. So an arm at half off's throughput is guarded after k samples, one at 0.8x
  after ~30 (it costs little to keep exploring an arm that is only mildly worse); or
  ``guard_rule="quantile"``: a has >= k samples and the ``guard_quantile`` (0.75) quantile of its per-step
  rewards is below ``(1 - guard_margin) * estimate(off)``: three quarters of a's recent steps were slower
  than off by more than the margin (biased against such skewed arms, as the median is); or
  ``guard_rule="ucb"``: a has >= k samples and its upper confidence bound ``mean + z * sd / sqrt(n)`` of the
  per-step rewards is below ``(1 - guard_margin)`` times off's lower bound ``mean - z * sd / sqrt(n)``; or
- (either rule, *costly arm*) a has >= ``fast_guard_samples`` (2) samples, every one of them is below
  ``(1 - guard_margin) * estimate(off)``, and one play of a costs at least ``fast_guard_cost`` (2) off steps
  of extra wall time. Play cost = ``mean_seconds(a) * (1 - estimate(a) / estimate(off)) / mean_seconds(off)``:
  the time a step of a takes beyond what off needs for the same tokens, in off steps. Evidence is cheap to
  keep collecting for a mildly worse arm, expensive for an arm ten times slower.

A guarded arm is not chosen (not even to explore) in that bucket until the guard lifts:

- *window turnover*: ``off`` has received ``hold`` further observations in that bucket, where
  ``hold = max(guard_hold * 2**strikes, g * probe_samples * play_cost / guard_regret_budget)`` (``guard_hold``
  defaults to ``window``: as many off steps as an arm's window holds; g = the number of arms guarded in the
  bucket, and a guarded arm's hold grows when another is guarded: the second term keeps the cost of
  re-probing *all* the bad arms near ``guard_regret_budget``, 2%, of the bucket's time; with one budget per
  arm, five drafting arms guarded at batch 64 on the default policy, each probe 1.6 off steps of extra
  time, re-probing cost ~10% of that bucket's time, measured on the long-tail benchmark); or the bucket as a whole
  has received ``max(guard_max_hold, hold)`` further observations (``guard_max_hold`` defaults to
  ``8 * window``: a guard does not last forever where off is rarely played); or
  ``reset_arms(drafter)`` is called (a new drafter version was loaded).
- On lift the arm's window is cleared and it goes on *probation*: it is played ``probe_samples`` times
  (default 2; fewer when a probe is already below off and costly). If every probe is below
  ``(1 - guard_margin) * estimate(off)`` it is guarded again with one more strike (the window-turnover hold
  doubles, up to ``2**guard_backoff``); otherwise its strikes reset and it competes on its fresh samples.
  So a bad arm costs 2..k plays, then at most ``probe_samples`` plays per (growing) hold.

Distribution
------------
Rollout actors do not call the tuner per step. They hold a ``TablePolicy``: an in-process copy of
``table()`` (per bucket: best arm, explorable arms, arms to probe) that chooses arms with its own epsilon
and batches observations; ``drain_observations()`` gives them back, and the central ``BucketedBandit``
ingests them with ``merge()`` (a list of observation dicts); ``merge()`` also takes another bandit's
``state_dict()``. ``state_dict()`` / ``load_state_dict()`` checkpoint and restore (JSON-serializable).
The table also carries each bucket's off estimate and the demotion settings (``demote_samples``, 16; None:
never): an actor demotes a drafting best that its own plays show reliably below off (``TablePolicy``), and
the ledger settings (``ledger_budget``, 0.1%; ``ledger_cap``; None: no ledger): an actor plays an arm's probes
and explorations only while their realized extra time over off, per bucket and arm, stays within the arm's
part of that share of its greedy steps' time, unless the table lists the arm as ``free`` (estimated at least
as fast as off: ``_free``) (``TablePolicy``, "Regret ledger"). The prices above come from estimates; the
ledger bounds what is actually spent (batch 64 on the long-tail benchmark, lock step: probes and exploration
6-7.5% of the rollout before, 0.5-2% with it at a 1% budget). On the distributed simulation of
``tests/tuner/test_bandit_sim.py`` (seeds 5-16) the time over the oracle's went from 4.1% to 2.5% (1%
budget), 2.2% (0.5%) and 2.4% (0.2%; 0.25% and 0.1%: 2.2% and 2.0%, so no
trend below 1%); batch 1's best is found in 11 or 12 of 12 seeds at each of these budgets. What the budget
costs where off is the best arm: on the long-tail benchmark's lock step (8 rounds, plain / A/A / adaptive
side by side), the adaptive rollouts' drafting steps cost 0.41 / 0.73 /
0.70 / 0.45% of their decode time at batch 1 / 4 / 16 / 64 with 0.5%, 0.26 / 0.35 / 0.14 / 0.08% with 0.2%
(a play at batch 64 costs ~5 off steps: 2% of a 250-step rollout, one play every ~10 such rollouts).
Simulated (benchmark-like schedules at batch 1 / 4 / 16 / 64, drafters whose acceptance varies from rollout
to rollout by a log-normal factor, sigma 0.35; 24 seeds, rollouts 5-12): speed vs always-off 1.135 / 1.026 /
0.996 / 0.994 with demotion after 16 plays, 1.088 / 1.011 / 0.989 / 0.990 without, 1.123 / 1.036 / 1.000 /
0.991 after 32. Since the ledger (one balance per bucket, 0.2%) the same simulation (16 seeds) gave 0.997 /
0.998 / 0.997 / 0.998: the costly arms' probes kept each bucket in debt and nothing else was explored; with a
balance per arm and free arms 1.110 / 1.042 / 1.010 / 1.007 (0.998 / 0.999 / 1.000 / 1.001 with every
drafter's acceptance at 0.55x, where off is the best everywhere), while the distributed simulation above
went from 2.1% to 3.0% over the oracle, batch 1's best found in 12 of 12 seeds (each actor's first probe of
each arm is no longer serialized behind the others). 0.1% (the default: in the benchmark's
never-worse rounds, where off is the best arm, the drafting steps still cost 0.2-0.45% at batch 1-16 with
0.2%): the same simulation (16 seeds, rollouts 5-12) 1.133 / 1.024 / 1.008 / 1.004 (0.2%: 1.110 / 1.042 /
1.010 / 1.007), weak drafters 0.998 / 0.999 / 1.000 / 1.000; batch 1's gain (>= 1.05) found in 9 of 16
seeds (0.2%: 5).

Beyond BEG-MAB: an explicit ``off`` baseline with a statistical, cost-aware regret guard; exploration priced
by a regret budget; probation with exponential backoff; untried/probe scheduling; a stall-capped throughput
estimate; drafter-version resets; mergeable state for many actors. On the simulated cost model of
``tests/tuner/test_bandit_sim.py`` (three buckets with three different best arms, 4,000 steps) it needs
3-4.5% more time than the oracle (seeds 0-2: 4.4 / 3.3 / 3.0%; 4.3-5.2% with a budget per guarded arm and
epsilon split over the unguarded arms only, 6.5-8.2% also without ``explore_regret_budget``), plain
epsilon-greedy without the guard 19-22%, always-off 32%.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any

from services.tuner.arms import OFF, Arm, Drafter, TunerConfigError, default_arms, parse_arms

STATE_FORMAT = 1
GUARD_RULES = ("throughput", "quantile", "ucb")
ESTIMATORS = ("capped", "median", "ratio", "trimmed")


@dataclass
class BanditConfig:
    """Bandit settings. See the module docstring for the meaning of each guard setting."""

    bucket_edges: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    window: int = 64
    off_window: int | None = None
    epsilon: float = 0.1
    explore_regret_budget: float | None = 0.01
    min_samples_for_guard: int = 6
    min_samples_for_best: int = 4
    best_z: float = 1.0
    guard_margin: float = 0.05
    guard_quantile: float = 0.75
    guard_rule: str = "throughput"
    guard_z: float = 2.0
    guard_cv_floor: float = 0.5
    guard_hold: int | None = None
    guard_max_hold: int | None = None
    guard_backoff: int = 5
    guard_regret_budget: float = 0.02
    fast_guard_samples: int = 2
    fast_guard_cost: float = 2.0
    probe_samples: int = 2
    demote_samples: int | None = 16
    ledger_budget: float | None = 0.001
    ledger_cap: float = 2.0
    estimator: str = "capped"
    stall_cap: float = 2.0
    trim: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, source: str = "config") -> None:
        p = f"{source}: tuner.bandit"
        edges = list(self.bucket_edges) if self.bucket_edges is not None else []
        if not edges:
            raise TunerConfigError(f"{p}.bucket_edges: must list at least one batch size, e.g. [1, 2, 4, 8]")
        for i, e in enumerate(edges):
            if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                raise TunerConfigError(f"{p}.bucket_edges[{i}]: must be an integer >= 1, got {e!r}")
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise TunerConfigError(f"{p}.bucket_edges: must be strictly increasing, got {edges}")
        self.bucket_edges = edges
        _check_int(self.window, f"{p}.window", 1)
        _check_num(self.epsilon, f"{p}.epsilon", 0.0, 1.0)
        if self.explore_regret_budget is not None:
            _check_num(self.explore_regret_budget, f"{p}.explore_regret_budget", 0.0, 1.0, lo_open=True)
        _check_int(self.min_samples_for_guard, f"{p}.min_samples_for_guard", 1)
        _check_int(self.min_samples_for_best, f"{p}.min_samples_for_best", 1)
        _check_num(self.best_z, f"{p}.best_z", 0.0, math.inf)
        _check_num(self.guard_margin, f"{p}.guard_margin", 0.0, 1.0, hi_open=True)
        _check_num(self.guard_quantile, f"{p}.guard_quantile", 0.0, 1.0, lo_open=True)
        if self.guard_rule not in GUARD_RULES:
            raise TunerConfigError(
                f"{p}.guard_rule: unknown rule {self.guard_rule!r}; expected one of {GUARD_RULES}"
            )
        _check_num(self.guard_z, f"{p}.guard_z", 0.0, math.inf)
        _check_num(self.guard_cv_floor, f"{p}.guard_cv_floor", 0.0, math.inf)
        if self.guard_hold is not None:
            _check_int(self.guard_hold, f"{p}.guard_hold", 1)
        if self.guard_max_hold is not None:
            _check_int(self.guard_max_hold, f"{p}.guard_max_hold", 1)
        if self.off_window is not None:
            _check_int(self.off_window, f"{p}.off_window", 1)
        _check_int(self.guard_backoff, f"{p}.guard_backoff", 0)
        _check_int(self.probe_samples, f"{p}.probe_samples", 1)
        if self.demote_samples is not None:
            _check_int(self.demote_samples, f"{p}.demote_samples", 2)
        _check_num(self.guard_regret_budget, f"{p}.guard_regret_budget", 0.0, 1.0, lo_open=True)
        if self.ledger_budget is not None:
            _check_num(self.ledger_budget, f"{p}.ledger_budget", 0.0, 1.0, lo_open=True)
        _check_num(self.ledger_cap, f"{p}.ledger_cap", 0.0, math.inf, lo_open=True)
        _check_int(self.fast_guard_samples, f"{p}.fast_guard_samples", 1)
        _check_num(self.fast_guard_cost, f"{p}.fast_guard_cost", 0.0, math.inf)
        _check_num(self.trim, f"{p}.trim", 0.0, 0.5, hi_open=True)
        _check_num(self.stall_cap, f"{p}.stall_cap", 1.0, math.inf)
        if self.estimator not in ESTIMATORS:
            raise TunerConfigError(
                f"{p}.estimator: unknown estimator {self.estimator!r}; expected one of {ESTIMATORS}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TunerConfigError(f"{p}.seed: must be an integer, got {self.seed!r}")

    @property
    def hold(self) -> int:
        return self.guard_hold if self.guard_hold is not None else self.window

    @property
    def max_hold(self) -> int:
        return self.guard_max_hold if self.guard_max_hold is not None else 8 * self.window

    @property
    def off_maxlen(self) -> int:
        return self.off_window if self.off_window is not None else 8 * self.window

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, source: str = "config") -> BanditConfig:
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise TunerConfigError(
                f"{source}: tuner.bandit: unknown key(s) {unknown}; allowed: {sorted(known)}"
            )
        if "bucket_edges" in d and d["bucket_edges"] is not None:
            d["bucket_edges"] = list(d["bucket_edges"])
        cfg = cls.__new__(cls)
        for k in known:
            setattr(cfg, k, d.get(k, _default_of(cls, k)))
        cfg.validate(source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _default_of(cls: type, name: str) -> Any:
    f = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _check_num(
    v: Any, where: str, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False
) -> None:
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    if ok:
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise TunerConfigError(f"{where}: must be a number in {interval}, got {v!r}")


def _check_int(v: Any, where: str, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise TunerConfigError(f"{where}: must be an integer >= {lo}, got {v!r}")


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of a sorted non-empty sequence (numpy's default rule)."""
    n = len(sorted_xs)
    if n == 1:
        return sorted_xs[0]
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


class _ArmStats:
    """One arm in one bucket: reward window, counters, guard state."""

    __slots__ = (
        "window",
        "seqs",
        "n",
        "chosen",
        "explored",
        "guarded",
        "guard_off_mark",
        "guard_obs_mark",
        "strikes",
        "hold",
        "reprobe",
        "probation",
        "_sorted",
        "_ratio",
        "_trimmed",
        "_capped",
    )

    def __init__(self, maxlen: int) -> None:
        self.window: deque[tuple[float, float]] = deque(maxlen=maxlen)  # (committed_tokens, seconds)
        # per window entry: the bucket's observation count when it arrived (-1: unknown, e.g. restored)
        self.seqs: deque[int] = deque(maxlen=maxlen)
        self.n = 0
        self.chosen = 0
        self.explored = 0
        self.guarded = False
        self.guard_off_mark = 0
        self.guard_obs_mark = 0
        self.strikes = 0
        self.hold = 0
        self.reprobe = 0.0  # probe_samples * play cost (off steps) of re-probing it, set when guarded
        self.probation = 0
        self._sorted: list[float] | None = None
        self._ratio: float | None = None
        self._trimmed: float | None = None
        self._capped: float | None = None

    def add(self, tokens: float, seconds: float, seq: int = -1) -> None:
        self.window.append((tokens, seconds))
        self.seqs.append(seq)
        self.n += 1
        self.invalidate()

    def clear(self) -> None:
        self.window.clear()
        self.seqs.clear()
        self.invalidate()

    def since(self, seq: int) -> _ArmStats:
        """A copy holding only the window entries that arrived at or after ``seq``."""
        out = _ArmStats(max(1, len(self.window)))
        for (t, s), q in zip(self.window, self.seqs):
            if q >= seq:
                out.window.append((t, s))
                out.seqs.append(q)
        return out

    def invalidate(self) -> None:
        """Drop the cached estimates (after the window changed)."""
        self._sorted = None
        self._ratio = None
        self._trimmed = None
        self._capped = None

    def sorted_rates(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(t / s for t, s in self.window)
        return self._sorted

    def median(self) -> float:
        return _quantile(self.sorted_rates(), 0.5) if self.window else float("nan")

    def ratio(self) -> float:
        if self._ratio is None:
            tok = sum(t for t, _ in self.window)
            sec = sum(s for _, s in self.window)
            self._ratio = tok / sec if sec > 0 else float("nan")
        return self._ratio

    def capped_ratio(self, cap: float) -> float:
        """sum(tokens) / sum(min(seconds, cap * median step seconds)) over the window: the throughput, with
        a stalled step counted as ``cap`` typical steps at most."""
        if self._capped is None:
            secs = sorted(s for _, s in self.window)
            lim = cap * _quantile(secs, 0.5)
            sec = sum(min(s, lim) for _, s in self.window)
            self._capped = sum(t for t, _ in self.window) / sec if sec > 0 else float("nan")
        return self._capped

    def capped_ratio_se(self, cap: float) -> tuple[float, float]:
        """``capped_ratio(cap)`` and its delta-method standard error (inf with fewer than two steps)."""
        r = self.capped_ratio(cap)
        n = len(self.window)
        if n < 2 or not math.isfinite(r):
            return r, math.inf
        secs = sorted(s for _, s in self.window)
        lim = cap * _quantile(secs, 0.5)
        capped = [(t, min(s, lim)) for t, s in self.window]
        mean_s = sum(s for _, s in capped) / n
        ss = sum((t - r * s) ** 2 for t, s in capped)
        return r, math.sqrt(ss / (n * (n - 1))) / mean_s

    def trimmed_ratio(self, trim: float) -> float:
        """sum(tokens) / sum(seconds) over the window without its ``trim`` fraction of slowest and fastest
        steps (by rate) on each side."""
        if self._trimmed is None:
            pairs = sorted(self.window, key=lambda ts: ts[0] / ts[1])
            cut = int(len(pairs) * trim)
            kept = pairs[cut : len(pairs) - cut] or pairs
            sec = sum(s for _, s in kept)
            self._trimmed = sum(t for t, _ in kept) / sec if sec > 0 else float("nan")
        return self._trimmed

    def mean_seconds(self) -> float:
        return sum(s for _, s in self.window) / len(self.window)

    def mean_sd(self) -> tuple[float, float]:
        xs = self.sorted_rates()
        m = sum(xs) / len(xs)
        var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
        return m, math.sqrt(var)

    def to_state(self) -> dict[str, Any]:
        return {
            "window": [[t, s] for t, s in self.window],
            "n": self.n,
            "chosen": self.chosen,
            "explored": self.explored,
            "guarded": self.guarded,
            "guard_off_mark": self.guard_off_mark,
            "guard_obs_mark": self.guard_obs_mark,
            "strikes": self.strikes,
            "hold": self.hold,
            "reprobe": self.reprobe,
            "probation": self.probation,
        }

    def load_state(self, st: Mapping[str, Any]) -> None:
        self.clear()
        for t, s in st.get("window", []):
            self.window.append((float(t), float(s)))
            self.seqs.append(-1)
        self.n = int(st.get("n", len(self.window)))
        self.chosen = int(st.get("chosen", 0))
        self.explored = int(st.get("explored", 0))
        self.guarded = bool(st.get("guarded", False))
        self.guard_off_mark = int(st.get("guard_off_mark", 0))
        self.guard_obs_mark = int(st.get("guard_obs_mark", 0))
        self.strikes = int(st.get("strikes", 0))
        self.hold = int(st.get("hold", 0))
        self.reprobe = float(st.get("reprobe", 0.0))
        self.probation = int(st.get("probation", 0))


def _throughput_se(st: _ArmStats, stall_cap: float, cv_floor: float) -> float:
    """Standard error of an arm's (stall-capped) throughput: delta method, at least ``cv_floor * R / sqrt(n)``
    (the floor alone for a single sample); inf without a finite throughput."""
    r, se = st.capped_ratio_se(stall_cap)
    if not math.isfinite(r):
        return math.inf
    floor = cv_floor * r / math.sqrt(len(st.window))
    return floor if len(st.window) < 2 else max(se, floor)


class _Bucket:
    __slots__ = ("arms", "obs", "off_obs")

    def __init__(self, arms: Sequence[Arm], maxlen: int, off_maxlen: int) -> None:
        self.arms: dict[str, _ArmStats] = {
            a.name: _ArmStats(off_maxlen if a.is_off else maxlen) for a in arms
        }
        self.obs = 0  # observations of any arm in this bucket
        self.off_obs = 0  # observations of off in this bucket


def _bucket_index(edges: Sequence[int], batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"batch_size must be a non-negative integer, got {batch_size!r}")
    return max(bisect.bisect_right(edges, batch_size) - 1, 0)


def _bucket_range(edges: Sequence[int], bucket: int) -> tuple[int, int | None]:
    """``(lo, hi)``: bucket ``bucket`` holds ``lo <= batch_size < hi`` (``hi`` None = no upper bound)."""
    return edges[bucket], (edges[bucket + 1] if bucket + 1 < len(edges) else None)


def _draw(names: Sequence[str], probs: Sequence[float], u: float) -> str | None:
    """The name whose probability interval holds the uniform ``u`` (intervals laid end to end from 0), or None
    when ``u`` lies beyond them all (probability ``1 - sum(probs)``)."""
    for n, p in zip(names, probs):
        if u < p:
            return n
        u -= p
    return None


def _arm_name(arm: Arm | str) -> str:
    return arm.name if isinstance(arm, Arm) else str(arm)


class BucketedBandit:
    """Per-bucket epsilon-greedy over ``arms`` with the ``off`` regret guard. Plain Python, single-threaded."""

    def __init__(
        self, arms: Iterable[Arm | Mapping | str] | None = None, cfg: BanditConfig | None = None
    ) -> None:
        self.cfg = cfg if cfg is not None else BanditConfig()
        self.cfg.validate()
        self.arms: list[Arm] = parse_arms(default_arms() if arms is None else arms)
        self._by_name: dict[str, Arm] = {a.name: a for a in self.arms}
        self._order: dict[str, int] = {a.name: i for i, a in enumerate(self.arms)}
        self.edges: list[int] = list(self.cfg.bucket_edges)
        self._buckets = [_Bucket(self.arms, self.cfg.window, self.cfg.off_maxlen) for _ in self.edges]
        self._rng = random.Random(self.cfg.seed)
        self._table_version = 0
        self.dropped = 0  # remote observations that could not be used (unknown arm, bad values)

    # ------------------------------------------------------------------ buckets and estimates
    def bucket_of(self, batch_size: int) -> int:
        return _bucket_index(self.edges, batch_size)

    def bucket_range(self, bucket: int) -> tuple[int, int | None]:
        """``(lo, hi)``: the bucket holds ``lo <= batch_size < hi`` (``hi`` None = no upper bound)."""
        return _bucket_range(self.edges, bucket)

    def arm(self, name: str) -> Arm:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"unknown arm {name!r}; arms are {list(self._by_name)}") from None

    def _estimate(self, st: _ArmStats) -> float:
        if self.cfg.estimator == "capped":
            return st.capped_ratio(self.cfg.stall_cap)
        if self.cfg.estimator == "median":
            return st.median()
        if self.cfg.estimator == "ratio":
            return st.ratio()
        return st.trimmed_ratio(self.cfg.trim)

    def estimate(self, batch_size: int, arm: Arm | str) -> float:
        """Current estimate (committed tokens / s) of ``arm`` in the bucket of ``batch_size``; NaN if none."""
        st = self._buckets[self.bucket_of(batch_size)].arms[self.arm(_arm_name(arm)).name]
        return self._estimate(st) if st.window else float("nan")

    def _guarded_below(self, i: int) -> set[str]:
        """Arms guarded in some bucket of smaller batch sizes than bucket ``i``."""
        return {n for b in self._buckets[:i] for n, st in b.arms.items() if st.guarded}

    def _forced(self, i: int) -> list[str]:
        """Arms of bucket ``i`` to play first: not guarded and untried (unless guarded in a bucket of smaller
        batch sizes), on probation, or with fewer than ``min_samples_for_best`` samples while its best sample so
        far is within ``guard_margin`` of off's estimate (an arm whose every sample lost to off cannot become
        the best on a few more; the guard and epsilon deal with it); least played first, then config order.

        Why the exception: a draft costs more the larger the batch it is verified in (the verify forward grows
        with batch x draft tokens; acceptance does not depend on the batch), so an arm reliably slower than off
        at batch 4 is slower at batch 16 too, and probing it there costs a slow step per bucket and table
        version (a cold rollout of 32 requests visits six buckets: 36 probe steps for six arms, the ones at
        batch >= 16 each 1.5-2x an off step). It can still be explored there once it has samples, and it is
        probed there as soon as the smaller bucket's guard lifts."""
        bucket = self._buckets[i]
        m = self.cfg.min_samples_for_best
        off = bucket.arms[OFF.name]
        bar = (1.0 - self.cfg.guard_margin) * self._estimate(off) if off.window else -math.inf
        below = self._guarded_below(i)

        def forced(n: str, st: _ArmStats) -> bool:
            if st.guarded:
                return False
            if st.probation > 0:
                return True
            if not st.window:
                return n not in below
            return len(st.window) < m and (n == OFF.name or st.sorted_rates()[-1] >= bar)

        names = [n for n, st in bucket.arms.items() if forced(n, st)]
        names.sort(key=lambda n: (bucket.arms[n].chosen, self._order[n]))
        return names

    def _eligible(self, bucket: _Bucket) -> list[str]:
        return [n for n, st in bucket.arms.items() if st.window and not st.guarded and st.probation == 0]

    def _best(self, bucket: _Bucket, eligible: list[str]) -> str:
        """Off, unless an eligible arm with at least ``min_samples_for_best`` samples beats off's estimate by
        ``best_z`` standard errors over the period both windows cover (``_common_period``); then the best
        estimate among those arms (config order on ties)."""
        m = self.cfg.min_samples_for_best
        off = bucket.arms[OFF.name]
        best, best_v = OFF.name, -math.inf
        for n in eligible:
            st = bucket.arms[n]
            if n == OFF.name or len(st.window) < m:
                continue  # too little evidence to displace off (it is still explored)
            if OFF.name in eligible:
                st_c, off_c = self._common_period(st, off)
                if len(st_c.window) < m:
                    continue  # too little evidence from the period off's estimate describes
                bar = self._estimate(off_c)
            else:
                st_c, bar = st, -math.inf
            if self._estimate(st_c) - self.cfg.best_z * self._se(st_c) <= bar:
                continue  # not reliably better than off
            v = self._estimate(st)
            if v > best_v:  # strict: config order wins ties
                best, best_v = n, v
        return best

    def _common_period(self, st: _ArmStats, off: _ArmStats) -> tuple[_ArmStats, _ArmStats]:
        """``st`` and off restricted to the period both windows cover (from the later of their oldest entries),
        so that a challenger is compared with off on steps taken under the same conditions (``_best``).

        Why: step costs drift with conditions the reward does not see: the context length (the requests
        left at batch 1 at the end of a large rollout are the longest), the engine's size, and on a shared
        machine its speed (+-20% within seconds here). Off, played most, keeps a recent slice; an explored
        arm's window spans many rollouts. Compared as they were, a slow recent slice of off (the tail of a
        batch-64 rollout) made every drafting arm look 1.2-1.5x faster than off at batch 1 in the long-tail
        benchmark, the table made ``ngram-k3`` the best there, and the adaptive policy then ran whole batch-1
        rollouts on it at 0.87x plain's speed (lock step). When off has fewer than ``min_samples_for_guard``
        steps in the common period (a drafting arm is the best and gets most steps), both windows are used
        whole, as before."""
        if not st.seqs or not off.seqs:
            return st, off
        start = max(st.seqs[0], off.seqs[0])
        off_c = off.since(start) if off.seqs[0] < start else off
        if len(off_c.window) < self.cfg.min_samples_for_guard:
            return st, off
        return (st.since(start) if st.seqs[0] < start else st), off_c

    def _cost_floor(self, i: int, name: str) -> float:
        """A pessimistic lower bound on arm ``name``'s extra time per committed token over off in bucket ``i``,
        for an arm with too few samples there to be priced by its own estimate: the largest
        ``estimate(off) / (estimate(a) + guard_z * se(a)) - 1`` over buckets ``j <= i`` where the arm has at
        least ``fast_guard_samples`` samples and off at least ``min_samples_for_guard`` (0 if none). Smaller
        batch sizes count because a draft's verify cost grows with the batch while its acceptance does not
        (``_forced``): an arm that costs c more than off at batch 4 costs at least c at batch 16."""
        k, m = self.cfg.min_samples_for_guard, self.cfg.fast_guard_samples
        cost = 0.0
        for b in self._buckets[: i + 1]:
            st, off = b.arms[name], b.arms[OFF.name]
            if len(st.window) < m or len(off.window) < k:
                continue
            upper = self._estimate(st) + self.cfg.guard_z * self._se(st)
            cost = max(cost, self._estimate(off) / upper - 1.0 if upper > 0 else math.inf)
        return cost

    def _free(self, i: int) -> list[str]:
        """Bucket ``i``'s drafting arms that the actors' regret ledger does not hold back (``TablePolicy``): not
        guarded, with samples, an estimate at least off's, and no cost floor from smaller buckets
        (``_cost_floor``). Their plays are not expected to cost anything over off. Why: a drafting arm's plays
        vary widely (most commit one token at a higher cost, a few commit many), so a faster arm's balance
        still went negative on its unlucky plays, and then only greedy steps could repay it: at 0.2% a batch-1
        arm 1.3x faster than off was played ~15 times in 10,000 steps instead of ~110 and not promoted in 4 of 8
        simulated seeds."""
        bucket = self._buckets[i]
        off = bucket.arms[OFF.name]
        if len(off.window) < self.cfg.min_samples_for_guard:
            return []
        bar = self._estimate(off)
        return [
            n
            for n, st in bucket.arms.items()
            if n != OFF.name
            and st.window
            and not st.guarded
            and self._estimate(st) >= bar
            and self._cost_floor(i, n) <= 0.0
        ]

    def _explore_p(self, i: int, best: str, others: list[str]) -> list[float]:
        """Per-step probability of exploring each arm of ``others`` in bucket ``i`` (module docstring:
        "Exploration with a regret budget"): ``epsilon / n`` capped at ``B / (n * c_a)``."""
        if not others:
            return []
        bucket = self._buckets[i]
        budget = self.cfg.explore_regret_budget
        if budget is None:
            return [self.cfg.epsilon / len(others)] * len(others)
        n_arms = len(bucket.arms) - 1  # every arm but the best has a share, guarded or not
        share = self.cfg.epsilon / n_arms
        # the best can be an off without samples in a bucket where other arms have some (evidence merged from
        # elsewhere): no reference then, and every arm keeps the full share
        ref = self._estimate(bucket.arms[best]) if bucket.arms[best].window else math.nan
        out = []
        for n in others:
            st = bucket.arms[n]
            if len(st.window) < self.cfg.min_samples_for_guard:
                # too few samples for its own estimate: priced by what its few samples here and in the
                # smaller buckets surely cost (else the full share, to collect the evidence the guard needs)
                cost = self._cost_floor(i, n)
            else:
                v = self._estimate(st)
                cost = ref / v - 1.0 if v > 0 else math.inf  # extra time per committed token vs the best
            out.append(share if not cost > 0 else min(share, budget / (n_arms * cost)))
        return out

    # ------------------------------------------------------------------ choose / observe
    def choose(self, batch_size: int) -> Arm:
        """The arm for a decode step at this active batch size (see the module docstring for the rule)."""
        i = self.bucket_of(batch_size)
        bucket = self._buckets[i]
        forced = self._forced(i)
        explored = True
        if forced:
            name = forced[0]
        else:
            eligible = self._eligible(bucket)
            best = self._best(bucket, eligible)
            others = [n for n in eligible if n != best]
            name = _draw(others, self._explore_p(i, best, others), self._rng.random())
            if name is None:
                name, explored = best, False
        st = bucket.arms[name]
        st.chosen += 1
        st.explored += int(explored)
        return self._by_name[name]

    def observe(
        self,
        batch_size: int,
        arm: Arm | str,
        committed_tokens: float,
        seconds: float,
        explored: bool | None = None,
        steps: int = 1,
    ) -> None:
        """Record one decode step: ``committed_tokens`` (accepted + bonus, whole batch) in ``seconds``
        (draft + verify wall time). ``explored`` is given only for steps chosen elsewhere (a ``TablePolicy``):
        then the step also counts as a choice here. ``steps`` > 1: the measured step stands for ``steps`` steps
        of ``arm`` in this bucket, the others not measured (a ``TunedStrategyPolicy``'s quiet steps): one
        window sample, every counter (observations, off observations for guard holds, choices) moves by
        ``steps``.

        Raises:
            KeyError: unknown arm.
            ValueError: ``seconds`` not finite and > 0, ``committed_tokens`` not finite and >= 0, ``steps`` < 1.
        """
        name = _arm_name(arm)
        if name not in self._by_name:
            raise KeyError(f"unknown arm {name!r}; arms are {list(self._by_name)}")
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        if not (isinstance(committed_tokens, (int, float)) and math.isfinite(committed_tokens)):
            raise ValueError(f"committed_tokens must be a finite number >= 0, got {committed_tokens!r}")
        if committed_tokens < 0:
            raise ValueError(f"committed_tokens must be >= 0, got {committed_tokens!r}")
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        bucket = self._buckets[self.bucket_of(batch_size)]
        st = bucket.arms[name]
        if explored is not None:
            st.chosen += steps
            st.explored += int(bool(explored))
        st.add(float(committed_tokens), float(seconds), bucket.obs)
        st.n += steps - 1
        bucket.obs += steps
        off = bucket.arms[OFF.name]
        if name == OFF.name:
            bucket.off_obs += steps
            for other, ost in bucket.arms.items():
                if other != OFF.name and not ost.guarded and ost.probation == 0:
                    self._check_guard(bucket, ost, off)
        elif st.probation > 0:
            self._probation_step(bucket, st, off)
        else:
            self._check_guard(bucket, st, off)
        self._check_lifts(bucket)

    def observe_many(self, observations: Iterable[Mapping[str, Any]]) -> int:
        """Ingest observation dicts (``TablePolicy.drain_observations()``); returns how many were used.
        Unusable ones (unknown arm, bad numbers) are counted in ``self.dropped`` instead of raising."""
        used = 0
        for ob in observations:
            try:
                self.observe(
                    int(ob["batch_size"]),
                    str(ob["arm"]),
                    float(ob["committed_tokens"]),
                    float(ob["seconds"]),
                    explored=bool(ob.get("explored", False)),
                    steps=int(ob.get("steps") or 1),
                )
                used += 1
            except (KeyError, ValueError, TypeError):
                self.dropped += 1
        return used

    # ------------------------------------------------------------------ guard
    def _se(self, st: _ArmStats) -> float:
        return _throughput_se(st, self.cfg.stall_cap, self.cfg.guard_cv_floor)

    def _threshold(self, off: _ArmStats) -> float | None:
        """``(1 - guard_margin) * estimate(off)``, or None while off has fewer than ``min_samples_for_guard``."""
        if len(off.window) < self.cfg.min_samples_for_guard:
            return None
        return (1.0 - self.cfg.guard_margin) * self._estimate(off)

    def _play_cost(self, st: _ArmStats, off: _ArmStats) -> float:
        """Extra wall time of one play of ``st`` over committing the same tokens with off, in units of one
        off step: ``mean_seconds(arm) * (1 - estimate(arm) / estimate(off)) / mean_seconds(off)``."""
        est_off = self._estimate(off)
        if not st.window or not off.window or est_off <= 0:
            return 0.0
        est_arm = max(self._estimate(st), 0.0)
        return max(0.0, st.mean_seconds() * (1.0 - est_arm / est_off) / off.mean_seconds())

    def _reliably_below(self, st: _ArmStats, off: _ArmStats) -> bool:
        thr = self._threshold(off)
        if thr is None or not st.window:
            return False
        rates = st.sorted_rates()
        if (
            len(rates) >= self.cfg.fast_guard_samples
            and rates[-1] < thr
            and self._play_cost(st, off) >= self.cfg.fast_guard_cost
        ):
            return True  # every sample below off and each play is expensive: do not wait for k samples
        if len(rates) < self.cfg.min_samples_for_guard:
            return False
        if self.cfg.guard_rule == "throughput":
            return st.capped_ratio(self.cfg.stall_cap) + self.cfg.guard_z * self._se(st) < thr
        if self.cfg.guard_rule == "quantile":
            return _quantile(rates, self.cfg.guard_quantile) < thr
        m_a, sd_a = st.mean_sd()
        m_o, sd_o = off.mean_sd()
        z = self.cfg.guard_z
        upper_a = m_a + z * sd_a / math.sqrt(len(rates))
        lower_o = m_o - z * sd_o / math.sqrt(len(off.window))
        return upper_a < (1.0 - self.cfg.guard_margin) * lower_o

    def _set_guard(self, bucket: _Bucket, st: _ArmStats, off: _ArmStats) -> None:
        """Guard ``st``: its hold is ``max(guard_hold * 2**strikes, g * probe_samples * play_cost /
        guard_regret_budget)`` further observations of off, g = the number of arms guarded in the bucket
        (this one included), so re-probing all of them costs at most about ``guard_regret_budget`` of off's
        time. The other guarded arms' holds grow to the new g (never shrink)."""
        st.reprobe = self.cfg.probe_samples * self._play_cost(st, off)
        st.hold = 0
        st.guarded = True
        st.probation = 0
        st.guard_off_mark = bucket.off_obs
        st.guard_obs_mark = bucket.obs
        guarded = [o for o in bucket.arms.values() if o.guarded]
        for o in guarded:
            regret_hold = len(guarded) * o.reprobe / self.cfg.guard_regret_budget
            o.hold = max(o.hold, self.cfg.hold * 2**o.strikes, math.ceil(min(regret_hold, 1e15) - 1e-9))

    def _check_guard(self, bucket: _Bucket, st: _ArmStats, off: _ArmStats) -> None:
        if self._reliably_below(st, off):
            self._set_guard(bucket, st, off)

    def _probation_step(self, bucket: _Bucket, st: _ArmStats, off: _ArmStats) -> None:
        """One probe of an arm on probation was observed (its window holds only the probes so far)."""
        st.probation -= 1
        thr = self._threshold(off)
        below = thr is not None and st.sorted_rates()[-1] < thr  # every probe so far below off by the margin
        if below and (st.probation == 0 or self._play_cost(st, off) >= self.cfg.fast_guard_cost):
            st.strikes = min(st.strikes + 1, self.cfg.guard_backoff)
            self._set_guard(bucket, st, off)
        elif st.probation == 0 or not below:
            st.strikes = 0 if not below else st.strikes
            st.probation = 0

    def _check_lifts(self, bucket: _Bucket) -> None:
        for st in bucket.arms.values():
            if not st.guarded:
                continue
            if bucket.off_obs - st.guard_off_mark >= st.hold or bucket.obs - st.guard_obs_mark >= max(
                self.cfg.max_hold, st.hold
            ):
                st.guarded = False
                st.clear()
                st.probation = self.cfg.probe_samples

    def reset_arms(self, drafter: Drafter | str | None = None) -> int:
        """Forget windows, guards and strikes of the arms that use ``drafter`` (all drafting arms if None), in
        every bucket, so they are tried afresh. Call when a new drafter version is loaded. ``hybrid`` arms
        count as using both ``suffix`` and ``learned``. Returns the number of (bucket, arm) entries reset."""
        d = Drafter(drafter) if drafter is not None else None
        names = [
            a.name
            for a in self.arms
            if not a.is_off
            and (
                d is None
                or a.drafter is d
                or (a.drafter is Drafter.HYBRID and d in (Drafter.SUFFIX, Drafter.LEARNED))
            )
        ]
        for bucket in self._buckets:
            for n in names:
                st = bucket.arms[n]
                st.clear()
                st.guarded = False
                st.strikes = 0
                st.probation = 0
        return len(names) * len(self._buckets)

    def is_guarded(self, batch_size: int, arm: Arm | str) -> bool:
        return self._buckets[self.bucket_of(batch_size)].arms[self.arm(_arm_name(arm)).name].guarded

    # ------------------------------------------------------------------ tables and stats
    def table(self) -> dict[str, Any]:
        """The strategy table rollout actors copy in-process (JSON-serializable). Per bucket: ``best`` (the
        greedy arm), ``explore`` (eligible arms other than best) with ``explore_p`` (each one's per-step
        probability, ``_explore_p``), ``probe`` (untried / on probation; each actor plays each once per table
        version), ``guarded``, ``off_estimate`` and ``free`` (arms the actors' regret ledger lets play in debt,
        ``_free``). Guarded arms appear in none of explore, probe and free."""
        self._table_version += 1
        buckets = []
        for i, bucket in enumerate(self._buckets):
            eligible = self._eligible(bucket)
            best = self._best(bucket, eligible)
            lo, hi = self.bucket_range(i)
            others = [n for n in eligible if n != best]
            off = bucket.arms[OFF.name]
            buckets.append(
                {
                    "bucket": i,
                    "lo": lo,
                    "hi": hi,
                    "best": best,
                    "explore": others,
                    "explore_p": self._explore_p(i, best, others),
                    "probe": self._forced(i),
                    "guarded": [n for n, st in bucket.arms.items() if st.guarded],
                    "off_estimate": self._estimate(off)
                    if len(off.window) >= self.cfg.min_samples_for_guard
                    else None,
                    "free": self._free(i),
                }
            )
        cfg = self.cfg
        return {
            "version": self._table_version,
            "epsilon": cfg.epsilon,
            "bucket_edges": list(self.edges),
            "arms": {a.name: a.to_dict() for a in self.arms},
            "buckets": buckets,
            "demote": None
            if cfg.demote_samples is None
            else {
                "samples": cfg.demote_samples,
                "z": cfg.best_z,
                "margin": cfg.guard_margin,
                "cv_floor": cfg.guard_cv_floor,
                "stall_cap": cfg.stall_cap,
            },
            "ledger": None
            if cfg.ledger_budget is None
            else {"budget": cfg.ledger_budget, "cap": cfg.ledger_cap},
        }

    def best_arms(self) -> dict[int, str]:
        """Bucket index -> current greedy arm name (``off`` for a bucket without data)."""
        return {i: self._best(b, self._eligible(b)) for i, b in enumerate(self._buckets)}

    def stats(self) -> dict[str, Any]:
        """Per bucket and arm: ``n`` (window samples), ``total`` (all observations), ``estimate`` (the
        configured estimator's), ``median`` and ``ratio`` (committed tokens / s; None without samples), ``chosen``, ``explored``, ``guarded``, ``strikes``,
        ``probation``; per bucket and overall ``exploration_fraction`` = explored / chosen."""
        out_buckets = []
        tot_chosen = tot_explored = 0
        for i, bucket in enumerate(self._buckets):
            arms = {}
            b_chosen = b_explored = 0
            for n, st in bucket.arms.items():
                arms[n] = {
                    "n": len(st.window),
                    "total": st.n,
                    "estimate": self._estimate(st) if st.window else None,
                    "median": st.median() if st.window else None,
                    "ratio": st.ratio() if st.window else None,
                    "chosen": st.chosen,
                    "explored": st.explored,
                    "guarded": st.guarded,
                    "strikes": st.strikes,
                    "probation": st.probation,
                }
                b_chosen += st.chosen
                b_explored += st.explored
            lo, hi = self.bucket_range(i)
            out_buckets.append(
                {
                    "bucket": i,
                    "lo": lo,
                    "hi": hi,
                    "observations": bucket.obs,
                    "best": self._best(bucket, self._eligible(bucket)),
                    "chosen": b_chosen,
                    "explored": b_explored,
                    "exploration_fraction": b_explored / b_chosen if b_chosen else 0.0,
                    "arms": arms,
                }
            )
            tot_chosen += b_chosen
            tot_explored += b_explored
        return {
            "buckets": out_buckets,
            "chosen": tot_chosen,
            "explored": tot_explored,
            "exploration_fraction": tot_explored / tot_chosen if tot_chosen else 0.0,
            "dropped": self.dropped,
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state: config, arms, per bucket and arm windows / counters / guards, RNG."""
        version, internal, gauss = self._rng.getstate()
        return {
            "format": STATE_FORMAT,
            "config": self.cfg.to_dict(),
            "arms": [a.to_dict() for a in self.arms],
            "buckets": [
                {"obs": b.obs, "off_obs": b.off_obs, "arms": {n: st.to_state() for n, st in b.arms.items()}}
                for b in self._buckets
            ],
            "rng": [version, list(internal), gauss],
            "table_version": self._table_version,
            "dropped": self.dropped,
        }

    def _check_compatible(self, state: Mapping[str, Any], what: str) -> None:
        if int(state.get("format", -1)) != STATE_FORMAT:
            raise TunerConfigError(
                f"{what}: unsupported state format {state.get('format')!r} (want {STATE_FORMAT})"
            )
        edges = list(state.get("config", {}).get("bucket_edges", []))
        if edges != self.edges:
            raise TunerConfigError(f"{what}: bucket_edges {edges} differ from this bandit's {self.edges}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()``. This bandit's config and arm list win: arms absent from the state start
        untried, arms absent from this bandit are ignored; windows longer than ``window`` keep the newest."""
        self._check_compatible(state, "load_state_dict")
        for b, bst in zip(self._buckets, state["buckets"]):
            b.obs = int(bst.get("obs", 0))
            b.off_obs = int(bst.get("off_obs", 0))
            for n, st in b.arms.items():
                if n in bst["arms"]:
                    st.load_state(bst["arms"][n])
                else:
                    st.load_state({})
        rng = state.get("rng")
        if rng is not None:
            self._rng.setstate((int(rng[0]), tuple(int(x) for x in rng[1]), rng[2]))
        self._table_version = int(state.get("table_version", 0))
        self.dropped = int(state.get("dropped", 0))

    def merge(self, other: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> int:
        """Merge evidence from elsewhere; returns the number of samples taken in.

        ``other`` is either a list of observation dicts (``TablePolicy.drain_observations()``: keys
        ``batch_size``, ``arm``, ``committed_tokens``, ``seconds``, ``explored``), ingested one by one, or
        another bandit's ``state_dict()`` (same bucket edges): its window samples are appended to ours (the
        window keeps the newest ``window``), counters are added, and guards are re-evaluated on the merged
        windows. Unknown arms are skipped."""
        if not isinstance(other, Mapping):
            return self.observe_many(other)
        self._check_compatible(other, "merge")
        taken = 0
        for bucket, bst in zip(self._buckets, other["buckets"]):
            bucket.obs += int(bst.get("obs", 0))
            bucket.off_obs += int(bst.get("off_obs", 0))
            for n, ost in bst["arms"].items():
                st = bucket.arms.get(n)
                if st is None:
                    continue
                for t, s in ost.get("window", []):
                    if float(s) > 0:
                        st.window.append((float(t), float(s)))
                        st.seqs.append(bucket.obs)  # arrived now: newer than every step already held
                        taken += 1
                st.invalidate()
                st.n += int(ost.get("n", 0))
                st.chosen += int(ost.get("chosen", 0))
                st.explored += int(ost.get("explored", 0))
                if st.probation and ost.get("window"):
                    st.probation = max(0, st.probation - len(ost["window"]))
            off = bucket.arms[OFF.name]
            for n, st in bucket.arms.items():
                if n != OFF.name and not st.guarded and st.probation == 0:
                    self._check_guard(bucket, st, off)
        return taken


def gate_table(table: Mapping[str, Any], drafters: Iterable[str]) -> dict[str, Any]:
    """A copy of a strategy table (``BucketedBandit.table()``) in which no bucket plays an arm of ``drafters``:
    they leave ``explore`` (and ``explore_p``) and ``probe``, and a ``best`` among them becomes ``off`` (the
    bucket then explores at ``epsilon / n``: its probabilities were priced against the old best); the bucket
    lists them
    under ``gated``. The bandit's statistics are untouched, so lifting the gate restores its table. Used to keep
    an untrained learned drafter out of rollouts (``tuner.learned_min_top1``)."""
    drop = set(drafters)
    if not drop:
        return dict(table)
    gated = {n for n, d in table["arms"].items() if d.get("drafter") in drop}
    buckets = []
    for b in table["buckets"]:
        nb = dict(b)
        explore = b.get("explore", [])
        p = b.get("explore_p") or [None] * len(explore)
        kept = [(n, q) for n, q in zip(explore, p) if n not in gated]
        nb["probe"] = [n for n in b.get("probe", []) if n not in gated]
        if nb["best"] in gated:
            # the probabilities were priced against the gated best: fall back to epsilon / n
            nb["best"] = OFF.name
            kept = [(n, None) for n, _ in kept if n != OFF.name]
        nb["explore"] = [n for n, _ in kept]
        nb["explore_p"] = [q for _, q in kept] if all(q is not None for _, q in kept) else []
        nb["gated"] = sorted(gated)
        buckets.append(nb)
    return {**table, "buckets": buckets}


_DEMOTE_KEYS = ("samples", "z", "margin", "cv_floor", "stall_cap")
_LEDGER_ALPHA = 0.05  # weight of one off step in the ledger's off seconds per token (~20-step memory)
# the keys of one observation dict (``TablePolicy.drain_observations``, ``BucketedBandit.merge``)
_OBSERVATION_KEYS = ("batch_size", "arm", "committed_tokens", "seconds", "explored", "table_version", "steps")


class TablePolicy:
    """In-process copy of the tuner's strategy table, used by a rollout actor every decode step (no RPC).

    ``choose(batch_size)``: plays each ``probe`` arm of the bucket once per table version, else each of the
    bucket's ``explore`` arms with its ``explore_p`` (the tuner's regret-budgeted probability; with an
    ``epsilon`` given here, or a table without ``explore_p``: ``epsilon / n`` each), else ``best``.
    ``observe(...)`` records the step; ``drain_observations()`` hands the records to the central tuner
    (``BucketedBandit.merge``). At most ``max_pending`` records are kept (oldest dropped, counted).

    Demotion (the table's ``demote`` settings, ``BanditConfig.demote_samples``): an actor plays a bucket's
    ``best`` until the next table arrives, typically a whole rollout. When the best is a drafting arm, the
    actor keeps its own throughput on it (the greedy plays since this table version, stall-capped as the
    tuner's estimate); once it has ``samples`` of them and ``R + z * se(R) < (1 - margin) * off_estimate``
    (the bucket's off estimate in the table; se as the tuner's, floored at ``cv_floor * R / sqrt(n)``), the
    bucket's best is off for the rest of this table version. It mirrors the promotion rule (``R - z * se``
    above off's estimate), so a best that the current rollout's prompts do not favour costs ``samples``
    steps, not the rollout: on the long-tail benchmark, a drafting best chosen on evidence from other
    prompts ran whole rollouts at batch 1 and 4 at +14-16% of off's time. The plays stay in the
    observations, so the tuner sees them too. ``demotions`` counts them (bucket index -> times). The test
    runs at ``samples`` plays, then after each further quarter of the plays so far (at least 4, at most half
    the window of ``8 * samples``): early, when a best chosen on other prompts shows, and rarely once it has
    held (each test sorts the window twice, ~60 us warm; run every 4th play it was ~15 us per step of a
    drafting best, 0.4% of a 3.9 ms decode step of the benchmark's small model at batch 1).

    Regret ledger (the table's ``ledger`` settings, ``BanditConfig.ledger_budget`` B and ``ledger_cap`` C):
    the tuner prices exploration by probabilities and estimates (``explore_p``, the guard's holds); this actor
    bounds what each arm's probes and explorations *actually* cost, per bucket, whatever those estimates say.
    Each arm other than the best has a share of the budget (n = the table's arms less one, as ``explore_p``'s
    shares) and its own balance in seconds: every greedy step adds ``B / n * seconds`` to each (except in a
    settled bucket, with nothing to probe or explore in this table version: nothing to spend it on; there off
    steps take the fast path, which records and nothing else); every probe or exploration step of the arm
    subtracts its extra time over plain decoding, ``seconds - committed_tokens * s_off``, where ``s_off`` is
    this actor's seconds per committed token of off in that bucket (an exponential average of its off steps,
    weight ``_LEDGER_ALPHA``, each step capped at twice the average: a GC pause is not a slow arm; the table's
    ``off_estimate`` until the actor has played off there). An arm probes or explores only while its balance
    is >= 0 or it is one of the bucket's ``free`` arms (the table's: estimated at least as fast as off,
    ``BucketedBandit._free``); else the bucket plays its best: its probe waits, an exploration drawn for it is
    a greedy step (``deferred`` counts those steps). A balance is capped at C off steps of the current batch
    size, so a long greedy stretch does not bank a burst. So the realized extra time of an arm's non-greedy
    steps is at most ``B / n`` of the greedy time plus one play and C off steps per bucket, over the actor's
    life (the balances survive table updates), all arms' together at most ``B`` plus one play and C off steps
    each, except where the table expects an arm to cost nothing (free), and an arm as fast as off (extra <= 0)
    is never held back. Why: the tuner's prices come from its windows, and at batch >= 32 they understate a
    draft's cost 2-3x (the verify of k + 1 tokens per row is compute-bound; the cost floor comes from smaller
    buckets); measured in lock step on the long-tail benchmark, probes and exploration at batch 32-64 were
    6-7.5% of a batch-64 rollout (`238409b`). Why one balance per arm: with one per bucket, the probes of
    costly arms (a learned drafter at 3-5x off's time per token) kept the bucket in debt, and the cheap arms'
    explorations waited behind them: on a simulated benchmark-like schedule (default arms, ``suffix-k4`` ~1.2x
    off at batch 1), batch 1 ran at 0.997x of always-off, its best never promoted; with a balance per arm
    1.075x, and with free arms 1.11x (a faster arm's unlucky plays had still put it in debt, repaid only by
    greedy steps). Without a reference (no off play here, no ``off_estimate``) steps are not priced. Known gap:
    an arm whose window a streak of poor rollouts left just below off's estimate is not free, and once in debt
    it waits for its share's slow repayment (at batch 1, 0.2% / 9 of the greedy time: ~10 rollouts of 1,000
    steps for a few ms of debt) before new plays refresh that window (the rollout-schedule simulation of
    ``tests/tuner/test_rollout_schedule_sim.py``: 6 of 16 seeds had not found a 1.2x arm by rollout 12).
    """

    def __init__(
        self,
        table: Mapping[str, Any],
        epsilon: float | None = None,
        seed: int = 0,
        max_pending: int = 100_000,
    ) -> None:
        if epsilon is not None and not 0.0 <= float(epsilon) <= 1.0:
            raise TunerConfigError(f"TablePolicy: epsilon must be in [0, 1], got {epsilon}")
        if max_pending < 1:
            raise TunerConfigError(f"TablePolicy: max_pending must be >= 1, got {max_pending}")
        self._epsilon_override = epsilon
        self._rng = random.Random(seed)
        # one tuple per measured decode step (batch_size, arm, committed_tokens, seconds, explored,
        # table_version, steps), made into dicts by ``drain_observations``: the per-step path runs every step
        self._pending: deque[tuple] = deque(maxlen=max_pending)
        self.dropped = 0
        # the last ``choose``: (batch size, bucket, arm, explored), or the batch size alone when it took the
        # fast path (a settled bucket's off step); read by the ``observe`` of that step
        self._last: tuple[int, int, str, bool] | int | None = None
        self.demotions: dict[int, int] = {}
        # regret ledger (class docstring), per bucket: the credit each arm's share has received so far (seconds),
        # the cap on an arm's balance (seconds), each touched arm's [balance, credit when last touched] and off's
        # seconds per committed token
        self._credit: list[float] = []
        self._cap: list[float] = []
        self._accounts: list[dict[str, list[float]]] = []
        self._off_spt: list[float | None] = []
        self.deferred = 0  # probe / exploration steps the ledger turned into greedy steps
        self.update(table)

    def update(self, table: Mapping[str, Any]) -> None:
        """Install a newer table (probes restart: each probe arm is played once more)."""
        try:
            edges = [int(e) for e in table["bucket_edges"]]
            arms = {n: Arm.from_dict(d, f"table arm {n!r}") for n, d in table["arms"].items()}
            buckets = list(table["buckets"])
        except (KeyError, TypeError) as e:
            raise TunerConfigError(f"TablePolicy: malformed strategy table ({e!r})") from None
        if len(buckets) != len(edges) or not edges:
            raise TunerConfigError(f"TablePolicy: table has {len(buckets)} buckets for {len(edges)} edges")
        for b in buckets:
            for n in [b["best"], *b.get("explore", []), *b.get("probe", [])]:
                if n not in arms:
                    raise TunerConfigError(f"TablePolicy: bucket {b.get('bucket')} names unknown arm {n!r}")
            ps = b.get("explore_p") or []
            if ps and (len(ps) != len(b.get("explore", [])) or not all(0.0 <= float(x) <= 1.0 for x in ps)):
                raise TunerConfigError(
                    f"TablePolicy: bucket {b.get('bucket')}: explore_p {ps} must hold one probability in [0, 1] "
                    f"per explore arm {b.get('explore', [])}"
                )
        ledger = None
        if table.get("ledger"):
            try:
                ledger = (float(table["ledger"]["budget"]), float(table["ledger"]["cap"]))
            except (KeyError, TypeError, ValueError) as e:
                raise TunerConfigError(
                    f"TablePolicy: malformed ledger settings {table['ledger']!r} (need budget, cap: {e!r})"
                ) from None
        self.version = int(table.get("version", 0))
        self.edges = edges
        self.arms = arms
        self.buckets = buckets
        self.epsilon = float(
            self._epsilon_override if self._epsilon_override is not None else table["epsilon"]
        )
        self._probed: set[tuple[int, str]] = set()
        self.demote = None
        if table.get("demote"):
            try:
                self.demote = {k: float(table["demote"][k]) for k in _DEMOTE_KEYS}
            except (KeyError, TypeError, ValueError) as e:
                raise TunerConfigError(
                    f"TablePolicy: malformed demote settings {table['demote']!r} (need {_DEMOTE_KEYS}: {e!r})"
                ) from None
        self._best_plays: dict[
            int, _ArmStats
        ] = {}  # bucket -> this version's greedy plays of a drafting best
        self._demoted: set[int] = set()
        self._best_next: dict[int, int] = {}  # bucket -> the play count of its next demotion test
        # buckets with nothing to probe or explore: ``choose`` returns their best without drawing
        self._settled = [not b.get("probe") and not b.get("explore") for b in buckets]
        # the per-step fast path: batch size -> the off arm, for batch sizes whose bucket is settled on off
        # (filled by ``choose``); ``_last`` is then that batch size alone, and ``observe`` only records
        self._fast: dict[int, Arm] = {}
        # buckets whose next ``choose`` explores, drawn ahead by ``quiet_run``: bucket -> the arm drawn (None:
        # drawn at that step, a bucket exploring with probability 1)
        self._forced: dict[int, str | None] = {}
        # the measured-step fast path (``choose_run``): batch size -> (its ``_last``, bucket, log(1 - P), P,
        # explore arms, their probabilities) for batch sizes whose bucket plays off greedily, explores with total
        # probability 0 < P < 1 and has no probe left in this table version
        self._lean: dict[int, tuple] = {}
        self._off_arm = arms.get(OFF.name)
        self.ledger = ledger
        if len(self._credit) != len(buckets):  # the first table, or other buckets: start afresh
            self._credit = [0.0] * len(buckets)
            self._cap = [math.inf] * len(buckets)
            self._accounts = [{} for _ in buckets]
            self._off_spt = [None] * len(buckets)
        # an arm's share of the ledger's budget: every arm but the best has one (``BucketedBandit._explore_p``)
        self._shares = max(1, len(arms) - 1)
        # per bucket: arms the ledger lets play in debt (``BucketedBandit._free``: not expected to cost anything)
        self._free = [frozenset(b.get("free") or ()) for b in buckets]
        for i, settled in enumerate(self._settled):
            if settled:  # its off steps do not update the reference (fast path): the table's until it moves
                self._off_spt[i] = None

    @property
    def off_arm(self) -> Arm | None:
        """The table's off arm (the object ``choose`` returns for it)."""
        return self._off_arm

    def bucket_of(self, batch_size: int) -> int:
        return _bucket_index(self.edges, batch_size)

    def bucket_range(self, bucket: int) -> tuple[int, int | None]:
        """``(lo, hi)``: the bucket holds ``lo <= batch_size < hi`` (``hi`` None = no upper bound)."""
        return _bucket_range(self.edges, bucket)

    def _explore_probs(self, b: Mapping[str, Any]) -> Sequence[float]:
        """Per-step probability of each of bucket ``b``'s ``explore`` arms: the table's ``explore_p``, or
        ``epsilon / n`` each (an ``epsilon`` given here, or a table without ``explore_p``)."""
        explore = b.get("explore") or []
        probs = b.get("explore_p") if self._epsilon_override is None else None
        return probs if probs else [self.epsilon / len(explore)] * len(explore)

    def quiet_run(self, batch_size: int, k: int) -> int:
        """After a ``choose(batch_size)`` (greedy off, or an exploration): how many of the next steps in this
        batch size's bucket (at most ``k``, whatever their batch sizes in the bucket) are certain to be greedy off
        steps, so the caller may play them without asking (a ``TunedStrategyPolicy``'s quiet steps). A bucket
        settled on off (nothing to probe or explore; its best, or its demoted best, is off): ``k``. A bucket
        whose best is off and that explores with total probability ``P`` (no probe left): the steps before its
        next exploration are drawn at once, geometric with parameter ``P`` (the same law as ``P`` drawn step by
        step), and so is that exploration's arm (in proportion to ``explore_p``). An arm the ledger holds back
        now (in debt, not free) makes that step a greedy step (counted in ``deferred``) and the run goes on to
        the next exploration drawn: the ledger's balances do not move during a run (quiet steps record
        nothing), so the check gives what it would at that step. When a playable exploration falls within ``k``
        steps, the bucket's next ``choose`` after the run plays it (checked against the ledger again there).
        Probes left only of arms in debt with the ledger: as if there were none (they wait until a measured
        step has credited the run). Anything else (a drafting best, probes left): 0."""
        if batch_size in self._fast:
            return k
        i = self.bucket_of(batch_size)
        b = self.buckets[i]
        if b["best"] != OFF.name and i not in self._demoted:
            return 0
        name, waiting = self._next_probe(i, b)
        if name is not None:
            return 0
        # a probe whose arm owes the ledger waits: greedy until a measured step credits the run (<= 2 runs later)
        explore = b.get("explore")
        if not explore:
            return k
        probs = self._explore_probs(b)
        total = sum(probs)
        if total <= 0.0:
            return k
        if total >= 1.0:
            self._forced[i] = None
            return 0
        lean = ((batch_size, i, OFF.name, False), i, math.log1p(-total), total, explore, probs)
        if not waiting and self._off_arm is not None:
            self._lean[batch_size] = lean
        pos, name = self._next_exploration(lean, k)
        if name is None:
            return k
        self._forced[i] = name
        return pos

    def plan_run(self, bucket: int, k: int) -> int:
        """``quiet_run`` for a bucket the caller is not in yet (it plans the buckets its batch size passes through
        next): how many of the bucket's next steps are certain to be greedy off steps, at most ``k``; 0 when its
        next step is already drawn (an exploration drawn ahead) or is not certain to be off."""
        if bucket in self._forced:
            return 0
        return self.quiet_run(self.bucket_range(bucket)[0], k)

    def _next_exploration(self, lean: tuple, limit: int) -> tuple[int, str | None]:
        """The draws of an exploring bucket (``_lean``'s entry) over the next ``limit`` steps: the position
        (0 = the first of them) of the first exploration that the ledger lets play and its arm, or ``(limit,
        None)``; the explorations it holds back are greedy steps (counted in ``deferred``)."""
        _, i, log_q, total, explore, probs = lean
        rng = self._rng
        # the ledger's balances do not move over the run: which arms it lets play is known once (a bucket whose
        # arms are all in debt drew ~50 held-back explorations per 1,023-step run, each checked against the
        # ledger: ~0.3 ms per run, a fifth of a batch-4 rollout's policy time)
        playable = {n for n in explore if self._may_play(i, n)}
        pos = 0
        while True:
            # failures before the first success of Bernoulli(total) trials: floor(log(u) / log(1 - total))
            pos += int(math.log(1.0 - rng.random()) / log_q)
            if pos >= limit:
                return limit, None
            u = rng.random() * total  # drawn either way: the same sequence of draws as ``choose``'s
            if playable:
                name = _draw(explore, probs, u)
                if name in playable:
                    return pos, name
            self.deferred += 1
            pos += 1

    def choose_run(self, batch_size: int, k: int) -> tuple[Arm, int]:
        """``choose(batch_size)`` and ``quiet_run(batch_size, k)`` in one call: what a ``TunedStrategyPolicy``'s
        measured step asks (after an exploration too: the steps after it are drawn at once, so the step after an
        exploration need not be measured). Where the bucket plays off greedily between explorations and no probe
        is left (``_lean``), the step takes a short path: this step's draw and the next ``k`` steps' are made at
        once (the same law), with no bucket lookup, probe scan or probability sum. Why: with the caches cold
        from the forward pass, the measured step's Python is slow (``choose`` + ``quiet_run`` took ~28 + 22 us
        per measured off step in the long-tail benchmark's never-worse rounds), and with one step in 14-22
        measured that was ~0.2% of decode time at batch 1 and 4; the short path took ~20-25 us. Returns
        ``(arm, quiet steps after this one)``."""
        arm = self._fast.get(batch_size)
        if arm is not None:
            self._last = batch_size
            return arm, k
        lean = self._lean.get(batch_size)
        if lean is not None and k > 0 and lean[1] not in self._forced:
            pos, name = self._next_exploration(lean, k + 1)  # this step (0) and the next k
            if name is None:
                self._last = lean[0]
                return self._off_arm, k
            self._forced[lean[1]] = name
            if pos > 0:
                self._last = lean[0]
                return self._off_arm, pos - 1
        arm = self.choose(batch_size)
        return arm, (self.quiet_run(batch_size, k) if k > 0 else 0)

    def choose(self, batch_size: int) -> Arm:
        arm = self._fast.get(batch_size)
        if arm is not None:  # the common case, every decode step: as little work as possible
            self._last = batch_size
            return arm
        i = self.bucket_of(batch_size)
        if self._settled[i]:  # no draw
            name = OFF.name if i in self._demoted else self.buckets[i]["best"]
            self._last = (batch_size, i, name, False)
            if name == OFF.name:
                self._fast[batch_size] = self.arms[name]
            return self.arms[name]
        b = self.buckets[i]
        explored = True
        forced = i in self._forced
        drawn = self._forced.pop(i) if forced else None
        # an arm in debt with the ledger is not played (class docstring): its probe waits, and an exploration
        # drawn for it is a greedy step
        name, waiting = self._next_probe(i, b)
        if name is not None:
            self._probed.add((i, name))
        elif b.get("explore"):
            explore = b["explore"]
            probs = self._explore_probs(b)
            if drawn is not None:  # ``quiet_run`` drew this step's exploration and its arm
                name = drawn
            else:
                u = self._rng.random()
                if forced:
                    # ``quiet_run`` drew this step's exploration: the arm in proportion to the probabilities
                    u *= min(1.0, sum(probs))
                name = _draw(explore, probs, u)
            if name is not None and not self._may_play(i, name):
                waiting, name = True, None
        self.deferred += waiting and name is None
        if name is None:
            name, explored = (OFF.name if i in self._demoted else b["best"]), False
        self._last = (batch_size, i, name, explored)
        return self.arms[name]

    def observe(
        self, batch_size: int, arm: Arm | str, committed_tokens: float, seconds: float, steps: int = 1
    ) -> None:
        """Record one step of ``arm`` (explored when it is what the last ``choose`` drew for this bucket).
        ``steps`` > 1: it also stands for ``steps - 1`` earlier steps of the arm at this batch size that were
        not measured (``BucketedBandit.observe``)."""
        last, self._last = self._last, None
        if last == batch_size and arm is self._off_arm:
            # fast path: a greedy off step of a settled bucket (nothing to demote, no ledger entry: a settled
            # bucket has nothing to spend it on; its balance moves again once it has)
            self._record(batch_size, OFF.name, float(committed_tokens), float(seconds), False, steps)
            return
        if isinstance(last, int):
            last = (last, self.bucket_of(last), OFF.name, False)
        name = _arm_name(arm)
        i = last[1] if last is not None and last[0] == batch_size else self.bucket_of(batch_size)
        # explored: the step the last ``choose`` drew for exploration (same bucket, same arm)
        explored = last is not None and last[3] and last[1] == i and last[2] == name
        self._record(int(batch_size), name, float(committed_tokens), float(seconds), explored, steps)
        if self.ledger is not None and not self._settled[i]:
            self._account(i, batch_size, name, float(committed_tokens), float(seconds), explored, steps)
        if not explored and name != OFF.name and self.demote is not None and i not in self._demoted:
            self._observe_best(i, float(committed_tokens), float(seconds))

    def forfeit(self, batch_size: int, arm: Arm | str, seconds: float) -> None:
        """The step the last ``choose`` drew is no sample: its time was mostly a one-off cost (a CUDA-graph
        capture, ``seconds`` of it), not the arm's per-step cost. Nothing is recorded; if the step was an
        exploration, ``seconds`` are charged to the arm's ledger balance: the capture is what exploring cost
        (with a fresh engine per rollout it recurs every rollout, and the ledger then bounds it)."""
        last, self._last = self._last, None
        if not isinstance(last, tuple) or last[0] != batch_size:
            return  # a greedy off step of a settled bucket (the fast path), or no ``choose`` for it
        _, i, name, explored = last
        if explored and name == _arm_name(arm) and self.ledger is not None and not self._settled[i]:
            self._charge(i, name, float(seconds))

    def _charge(self, i: int, name: str, seconds: float) -> None:
        """Arm ``name``'s ledger balance in bucket ``i`` less ``seconds`` (negative: time it earned back)."""
        self._accounts[i][name] = [self.ledger_balance(i, name) - seconds, self._credit[i]]

    def _record(
        self, batch_size: int, name: str, tokens: float, seconds: float, explored: bool, steps: int
    ) -> None:
        """Queue one observation record for ``drain_observations`` (the oldest dropped, and counted, when
        ``max_pending`` are waiting)."""
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append((batch_size, name, tokens, seconds, explored, self.version, steps))

    def _account(
        self,
        i: int,
        batch_size: int,
        name: str,
        tokens: float,
        seconds: float,
        explored: bool,
        steps: int = 1,
    ) -> None:
        """The regret ledger's entry for one step of bucket ``i`` (class docstring); a greedy record standing
        for ``steps`` steps credits them all at its own seconds."""
        spt = self._off_spt[i]
        if name == OFF.name and tokens > 0:  # probed or greedy, off's cost is off's cost
            x = seconds / tokens
            spt = x if spt is None else spt + _LEDGER_ALPHA * (min(x, 2.0 * spt) - spt)
            self._off_spt[i] = spt
        if spt is None:
            est = self.buckets[i].get("off_estimate")
            if not est:
                return  # no reference to price the step by
            spt = 1.0 / float(est)
        if explored:
            self._charge(i, name, seconds - tokens * spt)
        else:
            budget, cap = self.ledger
            self._credit[i] += budget * seconds * steps / self._shares
            self._cap[i] = cap * batch_size * spt

    def ledger_balance(self, i: int, name: str) -> float:
        """Arm ``name``'s balance with bucket ``i``'s regret ledger, in seconds (class docstring): its share of
        the credit since it was last played, less what its plays cost, capped (an arm never played: its share of
        all the credit so far, capped)."""
        balance, mark = self._accounts[i].get(name, (0.0, 0.0))
        return min(balance + self._credit[i] - mark, self._cap[i])

    def _next_probe(self, i: int, b: Mapping[str, Any]) -> tuple[str | None, bool]:
        """Bucket ``i``'s next probe of this table version that the ledger lets play (None if none), and whether
        a probe before it waits on its arm's debt."""
        waiting = False
        for n in b.get("probe", ()):
            if (i, n) not in self._probed:
                if self._may_play(i, n):
                    return n, waiting
                waiting = True
        return None, waiting

    def _may_play(self, i: int, name: str) -> bool:
        """Whether the ledger lets arm ``name`` probe or explore in bucket ``i`` now: a balance >= 0, or one of
        the bucket's ``free`` arms."""
        return self.ledger is None or name in self._free[i] or self.ledger_balance(i, name) >= 0.0

    def _observe_best(self, i: int, tokens: float, seconds: float) -> None:
        """One greedy play of bucket ``i``'s drafting best: demote it to off when reliably below off (see the
        class docstring)."""
        off_est = self.buckets[i].get("off_estimate")
        if off_est is None or seconds <= 0:
            return
        d = self.demote
        st = self._best_plays.get(i)
        if st is None:
            st = self._best_plays[i] = _ArmStats(maxlen=8 * int(d["samples"]))
        st.add(tokens, seconds)
        samples = int(d["samples"])
        if st.n < samples or st.n < self._best_next.get(i, 0):
            return  # the next test is due later (class docstring)
        self._best_next[i] = st.n + min(max(4, st.n // 4), 4 * samples)
        r = st.capped_ratio(d["stall_cap"])
        if r + d["z"] * _throughput_se(st, d["stall_cap"], d["cv_floor"]) < (1.0 - d["margin"]) * off_est:
            self._demoted.add(i)
            self.demotions[i] = self.demotions.get(i, 0) + 1

    def drain_observations(self) -> list[dict[str, Any]]:
        out = [dict(zip(_OBSERVATION_KEYS, rec)) for rec in self._pending]
        self._pending.clear()
        return out
