"""The central tuner's strategy table: one bandit per batch-size bucket, plain decoding (``off``) as baseline.

After TLT's BEG-MAB (arXiv 2511.16665, "Taming the Long Tail"): decode steps are bucketed by their *active
batch size*. A step's reward is its committed tokens per second of draft + verify (``selector.py`` measures
it). Per bucket and arm:

- estimate: throughput ``R = sum(tokens) / sum(seconds)`` over the arm's last ``window`` steps (a drafting
  arm's within the last ``horizon`` decode steps of all buckets), with its delta-method standard error; none
  below ``min_samples`` steps (``estimate_from_sums``);
- ``a`` is reliably faster than ``b`` when ``R_a - R_b > z * hypot(se_a, se_b)`` (``faster``);
- the row (``table()``): ``best`` is off unless an arm is reliably faster than off (then of those the one with
  the highest lower bound ``R - z * se``, ``lower``; a bucket without drafting evidence plays the nearest such
  bucket's best once off has an estimate there);
  ``guarded``: arms reliably slower than off, the k-th ban lasting ``ban_steps * 2 ** (k - 1)`` bucket steps;
  ``probe``: arms without an estimate; ``explore``: the others; ``allowance``: the regret budget left,
  ``regret_budget * time - spent`` seconds, where ``time`` is the bucket's decode seconds and ``spent``
  exploration's extra seconds over the best, ``sum(max(0, seconds - tokens / R_best))``.

Records age in decode steps of *all* buckets (``BucketedBandit.steps``), not in the bucket's own: a bucket that
gets a few steps per rollout (the tail's single requests) would otherwise keep records taken early in training
(the policy changes what drafting wins) for the whole run. A ban counts the bucket's own steps: an arm shown
slower there is retried after as many of that bucket's steps, which bounds its cost in each bucket.

docs/tuner.md gives the reasons.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.tuner.arms import OFF, Arm
from services.tuner.settings import Settings, TunerConfigError, check_int, check_number

STATE_FORMAT = 4


@dataclass
class BanditConfig(Settings):
    """Config section ``tuner.bandit`` (module docstring).

    bucket_edges: batch sizes where buckets start (bucket i: ``edges[i] <= b < edges[i + 1]``, the last
    open-ended); window: steps per arm in an estimate; min_samples: steps before an arm has an estimate;
    z: standard errors a difference must clear; regret_budget: exploration's extra time as a fraction of a
    bucket's time; ban_steps: bucket steps of a first ban; horizon: the decode steps (of all buckets) a
    drafting arm's estimate looks back.

    Raises:
        TunerConfigError: a value out of range (the message names the key).
    """

    SECTION = "bandit"
    # octaves up to 16, half octaves above: there a GPU verify turns compute-bound and a drafting arm's speed-up
    # over off falls steeply with the batch size (docs/tuner.md, "Arms and buckets")
    bucket_edges: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    )
    window: int = 64
    min_samples: int = 4
    z: float = 2.0
    regret_budget: float = 0.005
    ban_steps: int = 64
    horizon: int = 2048

    def validate(self, source: str = "config") -> None:
        p = f"{source}: tuner.bandit"
        edges = list(self.bucket_edges or [])
        if not edges or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in edges):
            raise TunerConfigError(f"{p}.bucket_edges: must list integers >= 1, got {self.bucket_edges!r}")
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise TunerConfigError(f"{p}.bucket_edges: must be strictly increasing, got {edges}")
        self.bucket_edges = edges
        for key, lo in (("window", 2), ("min_samples", 2), ("ban_steps", 1), ("horizon", 2)):
            check_int(getattr(self, key), f"{p}.{key}", lo)
        check_number(self.z, f"{p}.z", 0, math.inf)
        check_number(self.regret_budget, f"{p}.regret_budget", 0, 1)


def bucket_index(edges: Sequence[int], batch_size: int) -> int:
    """The bucket of an active batch size: ``i`` with ``edges[i] <= batch_size < edges[i + 1]`` (the last
    open-ended; sizes below the first edge go to bucket 0)."""
    return max(0, bisect.bisect_right(edges, batch_size) - 1)


def estimate_from_sums(n: float, sums: Sequence[float], min_samples: int) -> tuple[float, float] | None:
    """(R, se) in committed tokens per second from ``n`` records' ``[sum t, sum s, sum t*t, sum t*s, sum s*s]``
    (t: tokens, s: seconds), or None below ``min_samples`` records."""
    st, ss, stt, sts, sss = sums
    if n < max(2, min_samples) or ss <= 0:
        return None
    r = st / ss
    var = max(0.0, stt - 2 * r * sts + r * r * sss) / (n * (n - 1))  # sum((t - r s)^2) / (n (n - 1))
    return r, math.sqrt(var) / (ss / n)


def faster(a: tuple[float, float], b: tuple[float, float], z: float) -> bool:
    """Is estimate ``a`` reliably above estimate ``b`` (module docstring)?"""
    return a[0] - b[0] > z * math.hypot(a[1], b[1])


def lower(e: tuple[float, float], z: float) -> float:
    """The lower bound ``R - z * se`` of estimate ``e``: the best is the arm with the highest (an arm with few
    records was often played at moments its drafts paid, when the selector judged it faster)."""
    return e[0] - z * e[1]


class RateWindow:
    """The last ``size`` (tokens, seconds, step) records of one arm, with running sums (``estimate`` is
    O(1): the selector asks it on every decode step)."""

    def __init__(self, size: int, records: Iterable[Sequence[float]] = ()) -> None:
        self.records: deque[tuple[float, float, int]] = deque(maxlen=size)
        self._sums = [0.0] * 5  # sum t, s, t*t, t*s, s*s
        for r in records:
            self.append(float(r[0]), float(r[1]), int(r[2]))

    def __len__(self) -> int:
        return len(self.records)

    def _add(self, t: float, s: float, sign: float) -> None:
        for j, x in enumerate((t, s, t * t, t * s, s * s)):
            self._sums[j] += sign * x

    def append(self, tokens: float, seconds: float, at: int = 0) -> None:
        if len(self.records) == self.records.maxlen:
            self._add(*self.records[0][:2], -1.0)
        self.records.append((tokens, seconds, at))
        self._add(tokens, seconds, 1.0)

    def expire(self, before: int) -> None:
        """Drop the records taken before step ``before``."""
        while self.records and self.records[0][2] < before:
            self._add(*self.records.popleft()[:2], -1.0)

    def sums(self) -> list[float]:
        """``[n, sum t, sum s, sum t*t, sum t*s, sum s*s]`` over the records (what ``table()`` publishes)."""
        return [float(len(self.records)), *self._sums]

    def estimate(self, min_samples: int, prior: Sequence[float] | None = None) -> tuple[float, float] | None:
        """(R, se) in tokens/s, or None below ``min_samples`` records. ``prior``: another window's ``sums()``
        filling this window's free places, weighted ``(size - len(self)) / n_prior`` (at most 1)."""
        n, sums = float(len(self.records)), list(self._sums)
        if prior is not None and prior[0] > 0:
            w = min(1.0, (self.records.maxlen - n) / prior[0])
            n += w * prior[0]
            sums = [a + w * b for a, b in zip(sums, prior[1:])]
        return estimate_from_sums(n, sums, min_samples)


class _Arm:
    """One arm in one bucket (restored from ``state``, an ``_Arm.state`` at bucket step ``steps``): its window,
    steps played, explored steps, strikes and ban end (a bucket step; -1: not banned)."""

    def __init__(self, window: int, state: Mapping[str, Any] | None = None, steps: int = 0) -> None:
        state = state or {}
        self.window = RateWindow(window, state.get("window", ()))
        self.n, self.explored, self.strikes = (int(state.get(k, 0)) for k in ("n", "explored", "strikes"))
        ban_left = int(state.get("ban_left", -1))
        self.banned_until = steps + ban_left if ban_left >= 0 else -1

    def state(self, steps: int) -> dict[str, Any]:
        ban_left = self.banned_until - steps if self.banned_until >= 0 else -1
        window = [list(x) for x in self.window.records]
        return dict(window=window, n=self.n, explored=self.explored, strikes=self.strikes, ban_left=ban_left)

    def stats(self) -> dict[str, Any]:
        w = self.window.records
        ratio = sum(r[0] for r in w) / sum(r[1] for r in w) if w else None
        median = statistics.median(r[0] / r[1] for r in w) if w else None
        return dict(n=len(w), total=self.n, ratio=ratio, median=median, explored=self.explored) | {
            "guarded": self.banned_until >= 0,
            "strikes": self.strikes,
        }


class _Bucket:
    def __init__(self, arms: Sequence[Arm], window: int) -> None:
        self.arms = {a.name: _Arm(window) for a in arms}
        self.steps = 0
        self.time = self.spent = 0.0  # seconds (module docstring)


class BucketedBandit:
    """The central strategy table over ``arms`` (``off`` is added when missing): module docstring. It merges the
    actors' observations (``merge``), publishes ``table()`` and is checkpointed with ``state_dict`` /
    ``load_state_dict`` (JSON-serializable)."""

    def __init__(self, arms: Iterable[Arm], cfg: BanditConfig | None = None) -> None:
        self.cfg = cfg or BanditConfig()
        arms = list(arms)
        self.arms = arms if any(a.is_off for a in arms) else [OFF, *arms]
        self.edges = list(self.cfg.bucket_edges)
        self._buckets = [_Bucket(self.arms, self.cfg.window) for _ in self.edges]
        self.steps = 0  # decode steps observed in all buckets: the clock records age by
        self.version = 0
        self.dropped = 0  # observations of unknown arms

    def bucket_of(self, batch_size: int) -> int:
        """The bucket index of an active batch size (sizes below the first edge go to bucket 0)."""
        return bucket_index(self.edges, batch_size)

    def observe(self, batch_size: int, arm: Arm | str, tokens: float, seconds: float, **kw: Any) -> bool:
        """One record: a step's committed tokens and seconds (``seconds`` <= 0: counted, not timed); ``kw``:
        ``steps`` (how many steps it stands for, default 1) and ``explored``. Returns False for an arm this
        bandit does not have."""
        ob = {"batch_size": batch_size, "arm": str(arm), "committed_tokens": tokens, "seconds": seconds}
        return self.merge([{**ob, **kw}]) == 1

    def merge(self, observations: Iterable[Mapping[str, Any]]) -> int:
        """Fold actors' observation dicts (``StrategySelector.drain_observations``: ``batch_size``, ``arm``,
        ``committed_tokens``, ``seconds``, optional ``steps`` and ``explored``) in, then judge the buckets they
        touched. An explored step's extra seconds over the bucket's own best (as it stood before this merge; off
        while the bucket plays a borrowed best, which has no estimate there) are charged to its regret budget; an
        untimed record counts its arm's mean step seconds in the bucket's time. Returns how many were taken
        (unknown arms are dropped and counted in ``dropped``)."""
        rates: dict[int, float | None] = {}  # bucket -> its own best's throughput before this merge
        taken = 0
        for ob in observations:
            i = self.bucket_of(int(ob["batch_size"]))
            bucket = self._buckets[i]
            st = bucket.arms.get(str(ob["arm"]))
            if st is None:
                self.dropped += 1
                continue
            if i not in rates:
                best = self._row(i, self._drafting(i))["best"]  # a borrowed best has no estimate here
                est = bucket.arms[best].window.estimate(self.cfg.min_samples)
                rates[i] = est[0] if est else None
            steps, taken = max(1, int(ob.get("steps") or 1)), taken + 1
            tokens, seconds = float(ob["committed_tokens"]), float(ob["seconds"])
            bucket.steps += steps
            self.steps += steps
            st.n += steps
            st.explored += bool(ob.get("explored"))
            sums = st.window.sums()
            bucket.time += steps * (seconds if seconds > 0 else sums[2] / max(1.0, sums[0]))
            if seconds > 0:
                st.window.append(tokens, seconds, self.steps)
                if ob.get("explored") and rates[i]:
                    bucket.spent += max(0.0, seconds - tokens / rates[i])
        for bucket in self._buckets:  # all: a bucket's records age while others are played
            self._judge(bucket)
        return taken

    def _judge(self, bucket: _Bucket) -> None:
        """Expire drafting arms' records older than ``horizon`` steps; lift ended bans (the arm is probed
        afresh); ban arms reliably slower than off."""
        cfg = self.cfg
        off = bucket.arms[OFF.name].window.estimate(cfg.min_samples)
        for st in (st for name, st in bucket.arms.items() if name != OFF.name):  # off's cost does not drift
            st.window.expire(self.steps - cfg.horizon)
            if 0 <= st.banned_until <= bucket.steps:  # the ban ended: probed afresh
                st.banned_until, st.window = -1, RateWindow(cfg.window)
            est = st.window.estimate(cfg.min_samples) if st.banned_until < 0 else None
            if off is not None and est is not None and faster(off, est, cfg.z):
                st.strikes += 1
                st.banned_until = bucket.steps + cfg.ban_steps * 2 ** (st.strikes - 1)
            elif off is not None and est is not None and faster(est, off, cfg.z):
                st.strikes = 0

    def _drafting(self, i: int) -> bool:
        """Whether bucket ``i`` has drafting evidence: an unbanned drafting arm's estimate, or a strike (an arm
        judged slower than off there)."""
        return any(
            st.strikes or (st.banned_until < 0 and st.window.estimate(self.cfg.min_samples) is not None)
            for n, st in self._buckets[i].arms.items()
            if n != OFF.name
        )

    def _row(self, i: int, drafting: bool, borrowed: str | None = None) -> dict[str, Any]:
        """Bucket ``i``'s table row; ``drafting``: ``_drafting(i)``; ``borrowed``: the best of the nearest bucket
        with drafting evidence, played while this one has none (``table``)."""
        cfg, bucket = self.cfg, self._buckets[i]
        ests = {
            n: st.window.estimate(cfg.min_samples) for n, st in bucket.arms.items() if st.banned_until < 0
        }
        off, best = ests.get(OFF.name), OFF.name
        if off is not None and drafting:
            quicker = [
                (lower(e, cfg.z), n) for n, e in ests.items() if e is not None and faster(e, off, cfg.z)
            ]
            best = max(quicker)[1] if quicker else OFF.name
        elif borrowed in ests and off is not None and not drafting:
            best = borrowed
        probe = sorted(
            (n for n, e in ests.items() if e is None and n != best),
            key=lambda n: (n != OFF.name, len(bucket.arms[n].window)),
        )
        return {
            "bucket": i,
            "lo": self.edges[i],
            "hi": self.edges[i + 1] if i + 1 < len(self.edges) else None,
            "best": best,
            "explore": [n for n, e in ests.items() if e is not None and n != best],
            "probe": probe,
            "guarded": [n for n, st in bucket.arms.items() if st.banned_until >= 0],
            "windows": {n: bucket.arms[n].window.sums() for n in ests if len(bucket.arms[n].window)},
            "allowance": cfg.regret_budget * bucket.time - bucket.spent,  # seconds
        }

    def _rows(self) -> list[dict[str, Any]]:
        """Every bucket's row as ``table()`` publishes it."""
        drafting = [self._drafting(i) for i in range(len(self.edges))]
        rows = [self._row(i, d) for i, d in enumerate(drafting)]
        # a bucket without drafting evidence plays the best of the nearest bucket that has some: off's evidence
        # alone cannot say whether drafting pays, and some batch sizes get few steps per rollout. Not before off
        # has its estimate there: an arm cannot be judged against off without it (``_row``)
        known = [i for i, d in enumerate(drafting) if d]
        for i in (i for i, d in enumerate(drafting) if known and not d):
            rows[i] = self._row(i, False, rows[min(known, key=lambda j: (abs(j - i), j))]["best"])
        return rows

    def table(self) -> dict[str, Any]:
        """The strategy table the rollout actors play (JSON-serializable; a new ``version`` each call): per
        bucket ``lo``, ``hi`` (None: open-ended), ``best`` (a bucket without drafting evidence but with off's
        estimate: the nearest such bucket's), ``explore``, ``probe`` and ``guarded`` arm names,
        ``windows`` (arm -> ``RateWindow.sums()``, the arms not guarded with an estimate) and ``allowance``
        (seconds); the arms, ``regret_budget``, and the ``window``, ``min_samples`` and ``z`` of the
        estimates."""
        self.version += 1
        cfg, rows = self.cfg, self._rows()
        arms = {a.name: a.to_dict() for a in self.arms}
        return dict(version=self.version, bucket_edges=list(self.edges), arms=arms, buckets=rows) | dict(
            regret_budget=cfg.regret_budget, window=cfg.window, min_samples=cfg.min_samples, z=cfg.z
        )

    def stats(self) -> dict[str, Any]:
        """Per bucket (``bucket``, ``lo``, ``hi``, ``best``: the arm ``table()`` plays there): ``observations``
        and ``chosen`` (steps), ``explored``, ``exploration_fraction``, and per arm ``n`` (window), ``total``
        (steps), ``ratio`` (throughput, tokens/s), ``median`` (of the window's per-step rewards), ``explored``,
        ``guarded``, ``strikes``; overall ``exploration_fraction`` and ``dropped``."""
        out, frac = [], lambda a, b: a / b if b else 0.0
        for bucket, row in zip(self._buckets, self._rows()):
            arms = {n: st.stats() for n, st in bucket.arms.items()}
            explored, steps = sum(a["explored"] for a in arms.values()), bucket.steps
            out.append(
                {k: row[k] for k in ("bucket", "lo", "hi", "best")} | {"arms": arms, "explored": explored}
            )
            out[-1] |= {"observations": steps, "chosen": steps, "exploration_fraction": frac(explored, steps)}
        explored, steps = sum(b["explored"] for b in out), sum(b["chosen"] for b in out)
        return {"buckets": out, "exploration_fraction": frac(explored, steps), "dropped": self.dropped}

    def reset_arms(self, drafters: Iterable[str]) -> int:
        """Forget the evidence of every arm of ``drafters`` (a new drafter version); returns the arms reset."""
        names = {a.name for a in self.arms if str(a.drafter) in set(drafters)}
        for bucket in self._buckets:
            for n in names:
                bucket.arms[n] = _Arm(self.cfg.window)
        return len(names)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state: config, arms, the step count, per bucket its steps, time, spent and per arm
        window, counts and ban."""
        buckets = [
            dict(
                steps=b.steps,
                time=b.time,
                spent=b.spent,
                arms={n: st.state(b.steps) for n, st in b.arms.items()},
            )
            for b in self._buckets
        ]
        arms, cfg = [a.to_dict() for a in self.arms], self.cfg.to_dict()
        return dict(format=STATE_FORMAT, config=cfg, arms=arms, steps=self.steps, buckets=buckets) | {
            "version": self.version,
            "dropped": self.dropped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()``. This bandit's config and arms win: arms absent from the state start
        untried, others are ignored.

        Raises:
            TunerConfigError: another state format, or other bucket edges.
        """
        if state.get("format") != STATE_FORMAT:
            raise TunerConfigError(
                f"unsupported tuner state format {state.get('format')!r} (want {STATE_FORMAT})"
            )
        edges = list(state.get("config", {}).get("bucket_edges", []))
        if edges != self.edges:
            raise TunerConfigError(
                f"state bucket_edges {edges} differ from this tuner's {self.edges} "
                "(set tuner.bandit.bucket_edges to the state's to resume it)"
            )
        self.steps = int(state["steps"])
        for b, bst in zip(self._buckets, state["buckets"]):
            b.steps, b.time, b.spent = int(bst["steps"]), float(bst["time"]), float(bst["spent"])
            b.arms = {n: _Arm(self.cfg.window, bst["arms"].get(n), b.steps) for n in b.arms}
        self.version, self.dropped = int(state.get("version", 0)), int(state.get("dropped", 0))


def share_allowance(table: Mapping[str, Any], fraction: float) -> dict[str, Any]:
    """A copy of ``table`` with each bucket's ``allowance`` (seconds) scaled by ``fraction``: the n rollout
    actors that play one table charge their explorations to the same buckets, so each gets ``1 / n``; a replay
    of a sample (``measure_speedup``) gets none."""
    buckets = [{**b, "allowance": b.get("allowance", 0.0) * fraction} for b in table["buckets"]]
    return {**table, "buckets": buckets}


def gate_table(table: Mapping[str, Any], drafters: Iterable[str]) -> dict[str, Any]:
    """A copy of ``table`` in which no bucket plays an arm of ``drafters``: they leave ``explore``, ``probe``
    and ``windows``, a ``best`` among them becomes ``off``, and each bucket lists them under ``gated``. Keeps an
    untrained learned drafter out of rollouts (``tuner.learned_min_top1``); the bandit is untouched."""
    if not set(drafters):
        return dict(table)
    gated = sorted(n for n, d in table["arms"].items() if d.get("drafter") in set(drafters))
    buckets = []
    for b in table["buckets"]:
        best = OFF.name if b["best"] in gated else b["best"]
        explore = [n for n in b["explore"] if n not in gated and n != best]
        probe = [n for n in b["probe"] if n not in gated]
        windows = {n: e for n, e in b.get("windows", {}).items() if n not in gated}
        buckets.append(
            {**b, "best": best, "explore": explore, "probe": probe, "gated": gated, "windows": windows}
        )
    return {**table, "buckets": buckets}
