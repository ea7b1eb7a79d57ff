"""The sequential repetitions' tables: medians and speedups vs plain, the lossless length check, the verdicts.

Speedups are ratios of medians over repetitions vs tailspec ``plain`` at the same batch size: makespan, CPU
time, and long-tail tokens/s (decode steps with at most ``LONGTAIL_BATCH`` active requests; the tail holds a
random amount of work, so its throughput is the comparable speed). Each configuration's fastest repetition
is reported next to the median (the work is identical in every repetition, and a shared machine only adds
time). Lossless sanity: with sampling, outputs differ per configuration but their length distribution must
not; a mean length > 15% off plain's is flagged, and flagged configurations are left out of "best vLLM
(sane)".
"""

from __future__ import annotations

import math
import statistics

from benchmarks.longtail.runners import RunResult, pct
from benchmarks.longtail.workload import ADAPTIVE, ADAPTIVE_COLD, PLAIN, VLLM_CONFIGS, VLLM_MATCHED

LENGTH_TOLERANCE = 0.15
LONGTAIL_GOAL = 3.0  # long-tail tokens/s vs plain
VLLM_GOAL = 1.3  # adaptive makespan vs the best vLLM-CPU configuration
KEYS = (
    "makespan_s",
    "cpu_s",
    "tokens_per_s",
    "tail_s",
    "longtail_phase_s",
    "longtail_tokens_per_s",
    "longtail_cpu_s",
    "longtail_cpu_tokens_per_s",
    "tau",
    "mean_length",
    "p90_length",
    "max_length",
    "eos_fraction",
)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def identical_fraction(mine: RunResult, plain: RunResult | None) -> float | None:
    """Fraction of requests whose tokens equal plain's in the same repetition (None: not comparable)."""
    if plain is None or not mine.digests or len(mine.digests) != len(plain.digests):
        return None
    return sum(a == b for a, b in zip(mine.digests, plain.digests)) / len(mine.digests)


def by_config(runs: list[RunResult], configs: list[str], b: int) -> tuple[dict, dict[str, list[RunResult]]]:
    """At batch size ``b``: plain's runs by repetition, and each configuration's runs (those with any)."""
    plains = {r.rep: r for r in runs if r.config == PLAIN and r.batch_size == b}
    mine = {c: [r for r in runs if r.config == c and r.batch_size == b] for c in configs}
    return plains, {c: rs for c, rs in mine.items() if rs}


def aggregate(runs: list[RunResult], configs: list[str], batch_sizes: list[int]) -> dict:
    """Per batch size and configuration: medians over repetitions (``KEYS``; the makespan as
    ``makespan_s_median``, its minimum and spread), the share of responses token-identical to plain's, and the
    speedups vs plain (ratios of medians; ``speedup_makespan_min_vs_plain`` of the fastest repetitions)."""
    out: dict = {}
    for b in batch_sizes:
        row: dict = {}
        plains, per_config = by_config(runs, configs, b)
        for c, mine in per_config.items():
            rs = [r.summary() for r in mine]
            d = {k + ("_median" if k == "makespan_s" else ""): median([r[k] for r in rs]) for k in KEYS}
            ms = [r["makespan_s"] for r in rs]
            d.update(reps=len(rs), makespan_s_all=[round(x, 4) for x in ms], makespan_s_min=min(ms))
            d["makespan_spread"] = (max(ms) - min(ms)) / d["makespan_s_median"]
            same = [x for x in (identical_fraction(r, plains.get(r.rep)) for r in mine) if x is not None]
            d["identical_to_plain"] = statistics.fmean(same) if same else None
            row[c] = d
        p = row.get(PLAIN) or {}
        for d in row.values():
            d["speedup_makespan_vs_plain"] = ratio(p.get("makespan_s_median"), d["makespan_s_median"])
            d["speedup_makespan_min_vs_plain"] = ratio(p.get("makespan_s_min"), d["makespan_s_min"])
            d["speedup_cpu_vs_plain"] = ratio(p.get("cpu_s"), d["cpu_s"])
            d["speedup_longtail_vs_plain"] = ratio(d["longtail_tokens_per_s"], p.get("longtail_tokens_per_s"))
            d["speedup_longtail_cpu_vs_plain"] = ratio(
                d["longtail_cpu_tokens_per_s"], p.get("longtail_cpu_tokens_per_s")
            )
            d["mean_length_vs_plain"] = ratio(d["mean_length"], p.get("mean_length"))
        out[str(b)] = row
    return out


def length_check(runs: list[RunResult], configs: list[str], tolerance: float = LENGTH_TOLERANCE) -> dict:
    """Lossless sanity check: per configuration, all its responses (every batch size and repetition) pooled;
    mean length vs plain's, flagged when more than ``tolerance`` off. ``rel_se`` is the relative standard
    error of the difference of the two means (a deviation of a few ``rel_se`` is expected by chance)."""
    pooled = {c: [n for r in runs if r.config == c for n in r.lengths] for c in configs}
    eos = {c: [e for r in runs if r.config == c for e in r.eos] for c in configs}
    base = pooled.get(PLAIN) or []
    out = {}
    for c, xs in pooled.items():
        if not xs:
            continue
        mean = statistics.fmean(xs)
        d = {
            "responses": len(xs),
            "mean_length": mean,
            "p90_length": pct(xs, 0.9),
            "max_length": max(xs),
            "eos_fraction": sum(eos[c]) / len(eos[c]),
        }
        if base and len(xs) > 1 and len(base) > 1:
            bm = statistics.fmean(base)
            se = math.sqrt(statistics.variance(xs) / len(xs) + statistics.variance(base) / len(base))
            d["mean_length_vs_plain"] = mean / bm
            d["rel_se"] = se / bm
            d["flag"] = abs(mean / bm - 1) > tolerance
        out[c] = d
    return out


def _best_longtail(v: dict, fixed_rows: dict) -> None:
    """The best drafter in the long tail (wall and CPU tokens/s vs plain) against ``LONGTAIL_GOAL``."""
    v["longtail_goal"] = LONGTAIL_GOAL
    for key, name in (("speedup_longtail_vs_plain", ""), ("speedup_longtail_cpu_vs_plain", "_cpu")):
        spec_rows = {c: d for c, d in fixed_rows.items() if c != PLAIN and d[key]}
        if spec_rows:
            lt = max(spec_rows, key=lambda c: spec_rows[c][key])
            v[f"best_longtail_drafter{name}"] = lt
            v[f"best_longtail_speedup{name}"] = spec_rows[lt][key]
            v[f"longtail_goal_met{name}"] = spec_rows[lt][key] >= LONGTAIL_GOAL


def _best_vllm(v: dict, row: dict, flagged: set[str]) -> None:
    """The best vLLM-CPU configuration (all; passing the length check; length-matched) against tailspec plain
    and adaptive (``VLLM_GOAL``)."""
    vl = {c: d for c, d in row.items() if c in VLLM_CONFIGS}
    pools = {"": vl, "_sane": {c: d for c, d in vl.items() if c not in flagged}}
    pools["_matched"] = {c: d for c, d in row.items() if c in VLLM_MATCHED}
    for tag, pool in pools.items():
        if not pool:
            continue
        bv = min(pool, key=lambda c: pool[c]["makespan_s_median"])
        v[f"best_vllm{tag}"] = bv
        v[f"best_vllm{tag}_makespan_s"] = pool[bv]["makespan_s_median"]
        if PLAIN in row:
            v[f"plain_speedup_vs_best_vllm{tag}"] = (
                pool[bv]["makespan_s_median"] / row[PLAIN]["makespan_s_median"]
            )
        if ADAPTIVE in row:
            sp = pool[bv]["makespan_s_median"] / row[ADAPTIVE]["makespan_s_median"]
            v[f"adaptive_speedup_vs_best_vllm{tag}"] = sp
            v[f"vllm_goal_met{tag}"] = sp >= VLLM_GOAL


def verdicts(table: dict, fixed: list[str], lengths: dict | None = None) -> dict:
    """Per batch size: the best fixed arm (plain included) by median and by fastest makespan; the best
    long-tail drafter; the adaptive policy (warm and cold) against the best fixed arm (within 5%?) and against
    plain (not worse?); the best vLLM-CPU configurations against tailspec plain and adaptive."""
    flagged = {c for c, d in (lengths or {}).items() if d.get("flag")}
    per_b = {}
    for b, row in table.items():
        fixed_rows = {c: row[c] for c in [PLAIN, *fixed] if c in row}
        v: dict = {}
        if fixed_rows:
            best = min(fixed_rows, key=lambda c: fixed_rows[c]["makespan_s_median"])
            best_min = min(fixed_rows, key=lambda c: fixed_rows[c]["makespan_s_min"])
            v.update(best_fixed_arm=best, best_fixed_makespan_s=fixed_rows[best]["makespan_s_median"])
            v.update(
                best_fixed_arm_min=best_min, best_fixed_makespan_s_min=fixed_rows[best_min]["makespan_s_min"]
            )
            _best_longtail(v, fixed_rows)
        plain = row.get(PLAIN)
        for c, tag in ((ADAPTIVE, "adaptive"), (ADAPTIVE_COLD, "adaptive_cold")):
            if c not in row or not fixed_rows:
                continue
            a = row[c]
            v[f"{tag}_over_best_fixed"] = a["makespan_s_median"] / v["best_fixed_makespan_s"]
            v[f"{tag}_within_5pct_of_best"] = v[f"{tag}_over_best_fixed"] <= 1.05
            v[f"{tag}_over_best_fixed_min"] = a["makespan_s_min"] / v["best_fixed_makespan_s_min"]
            v[f"{tag}_within_5pct_of_best_min"] = v[f"{tag}_over_best_fixed_min"] <= 1.05
            if plain:
                v[f"{tag}_speedup_vs_plain"] = plain["makespan_s_median"] / a["makespan_s_median"]
                v[f"{tag}_speedup_vs_plain_min"] = plain["makespan_s_min"] / a["makespan_s_min"]
                v[f"{tag}_not_worse_than_plain"] = a["makespan_s_median"] <= plain["makespan_s_median"]
        if plain:
            v["plain_makespan_spread"] = plain["makespan_spread"]
        _best_vllm(v, row, flagged)
        per_b[b] = v
    return per_b
