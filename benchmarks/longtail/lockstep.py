"""Lock-step rounds and the A/A control: what the README's lock-step and never-worse figures are made of.

Sequential runs seconds apart see this machine's speed drift by +-20%, which buries a 5% difference. In lock
step every tailspec configuration plus ``plain-again`` (a second plain engine) decode the same workload side
by side in one process, one engine step each per round, and each configuration's makespan is the sum of its
own step times: all see the same speed to within a round, and ``plain-again``'s ratio to plain (the A/A
control) shows what is left. Issue #4's bar (adaptive within 5% of the best fixed arm, not worse than plain)
is judged on these rounds (``lockstep_verdicts``).

Never-worse rounds: plain, adaptive and plain-again alone in lock step, more rounds at a third of the cost,
in this process and in ``--never-worse-procs`` fresh ones (each with its own model load, history and
warm-up: what a process fixes, e.g. its memory layout, shifts all its rounds alike). Per round, adaptive vs
the mean of the two plains; the verdict pools all rounds and takes the larger of the rounds' standard error
and that of the processes' means (``never_worse_table``).
"""

from __future__ import annotations

import argparse
import math
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.longtail.runners import RunResult, TailspecRunner
from benchmarks.longtail.tables import by_config, identical_fraction, median
from benchmarks.longtail.workload import ADAPTIVE, PLAIN, PLAIN_AGAIN, REPO, Workload
from benchmarks.side_by_side import decode_side_by_side
from services.tuner.arms import OFF

NEVER_WORSE_REP0 = (
    100  # the never-worse rounds' repetition numbers start here (apart from the lock-step ones)
)
NEVER_WORSE_PROC_STRIDE = 1000  # fresh process p numbers its rounds from NEVER_WORSE_REP0 + p * this


def run_lockstep(
    runner: TailspecRunner, configs: list[str], workload: Workload, sampling: dict, seed: int, rep: int
) -> list[RunResult]:
    """One rollout of the workload per configuration, all decoded side by side: each round, every engine with
    unfinished requests takes one ``step()``, in a fresh random order each round (seeded by ``seed`` and
    ``rep``; the engines are built in a random order too: with twelve engines' caches in memory, the one built
    first ran 1-2.5% behind an identical one at batch 64). A fixed order would let the same engine always
    follow a learned-drafter engine, which leaves the caches cold (measured: 4-7% slower steps). A
    configuration's makespan is the sum of the wall times of its own ``step()`` calls and its requests'
    admission (CPU time likewise). Finish times and timelines are not comparable here and are left empty.
    Returns one ``RunResult`` per configuration, in ``configs`` order."""
    if len(set(configs)) != len(configs):
        raise ValueError(f"lock-step configurations must be distinct: {configs}")
    order_rng = random.Random(seed * 1_000_003 + rep)
    building = list(configs)
    order_rng.shuffle(building)
    built = {c: runner.engine(c, workload, rep, own_learned=True) for c in building}
    reqs = {c: workload.requests(sampling, seed) for c in configs}
    outs, spent, cpu = decode_side_by_side({c: built[c][0] for c in configs}, reqs, order_rng)
    results = []
    for c in configs:
        eng, policy = built[c]
        res = runner.finish(c, workload, rep, spent[c], cpu[c], outs[c], eng, policy)
        res.finish_s, res.timeline = [], []
        res.note = "lock step"
        results.append(res)
    return results


def lockstep_table(runs: list[RunResult], configs: list[str], batch_sizes: list[int]) -> dict:
    """Per batch size and configuration: the makespan (sum of its own step times) median over repetitions, and
    the paired speedup vs plain (plain's makespan / the configuration's, within one round: min / median / max
    over repetitions). ``plain-again``'s paired ratios are the A/A control: the measurement's own noise."""
    out: dict = {}
    for b in batch_sizes:
        row: dict = {}
        plains, per_config = by_config(runs, configs, b)
        for c, rs in per_config.items():
            sp = [plains[r.rep].makespan_s / r.makespan_s for r in rs if r.rep in plains and r.makespan_s > 0]
            same = [x for x in (identical_fraction(r, plains.get(r.rep)) for r in rs) if x is not None]
            taus = [t for r in rs if (t := r.summary()["tau"]) is not None]
            row[c] = {
                "reps": len(rs),
                "makespan_s_median": median([r.makespan_s for r in rs]),
                "makespan_s_by_rep": {r.rep: r.makespan_s for r in rs},
                "cpu_s_median": median([r.cpu_s for r in rs]),
                "speedup_paired_median": median(sp),
                "speedup_paired_min": min(sp) if sp else None,
                "speedup_paired_max": max(sp) if sp else None,
                "speedup_paired_all": [round(x, 4) for x in sp],
                "tau": median(taus),
                "identical_to_plain": statistics.fmean(same) if same else None,
                "tokens": median([r.tokens for r in rs]),
            }
        out[str(b)] = row
    return out


def lockstep_verdicts(table: dict, fixed: list[str]) -> dict:
    """Issue #4's bar on the lock-step rounds, per batch size: the best fixed arm (plain included) by paired
    speedup vs plain; adaptive's makespan over the best fixed arm's (median over rounds of the same-round
    ratio: within 5%?); adaptive vs plain (paired median: not worse?, and not worse beyond the A/A control's
    lowest ratio, i.e. than plain measured against itself)."""
    per_b = {}
    for b, row in table.items():
        v: dict = {}
        cands = {c: row[c] for c in [PLAIN, *fixed] if c in row}
        if cands:
            best = max(cands, key=lambda c: cands[c]["speedup_paired_median"] or 0)
            v["best_fixed_arm"] = best
            v["best_fixed_speedup_vs_plain"] = cands[best]["speedup_paired_median"]
        aa = row.get(PLAIN_AGAIN)
        if aa and aa["speedup_paired_all"]:
            v["aa_ratios"] = aa["speedup_paired_all"]
            v["aa_noise"] = max(abs(1 - x) for x in aa["speedup_paired_all"])
        a = row.get(ADAPTIVE)
        if a and cands:
            bm = cands[v["best_fixed_arm"]]["makespan_s_by_rep"]
            over = [x / bm[k] for k, x in a["makespan_s_by_rep"].items() if bm.get(k)]  # same round
            v["adaptive_over_best_fixed"] = median(over)
            v["adaptive_within_5pct_of_best"] = v["adaptive_over_best_fixed"] <= 1.05
            v["adaptive_speedup_vs_plain"] = a["speedup_paired_median"]
            v["adaptive_speedup_vs_plain_range"] = [a["speedup_paired_min"], a["speedup_paired_max"]]
            v["adaptive_not_worse_than_plain"] = a["speedup_paired_median"] >= 1.0
            if "aa_ratios" in v:
                v["adaptive_not_worse_than_plain_beyond_aa"] = a["speedup_paired_median"] >= min(
                    v["aa_ratios"]
                )
        per_b[b] = v
    return per_b


def never_worse_table(runs: list[RunResult], batch_sizes: list[int]) -> dict:
    """The never-worse rounds, per batch size: is adaptive slower than plain by more than the rounds resolve?
    Per round k: ``r_k = (plain_k + plain-again_k) / 2 / adaptive_k`` and the A/A ratio ``plain_k /
    plain-again_k``; rounds matched by repetition (one missing a configuration is left out). Reported: the mean
    of r and its standard error ``se``; each process's mean of r (a round's process is ``(rep -
    NEVER_WORSE_REP0) // NEVER_WORSE_PROC_STRIDE``) and their standard error ``process_se``; ``se_verdict =
    max(se, process_se)``; ``slowdown_bound = 1 - (mean - 2 se_verdict)``, ``resolution = 2 se_verdict``;
    ``not_worse`` = mean >= 1, ``not_worse_2se`` = mean + 2 se_verdict >= 1 (se fields None below two rounds);
    ``drafted_fraction``: the share of adaptive's decode steps in those rounds that drafted (any arm but off),
    ``drafted_arms``: its three most played drafting arms' shares of the steps (where a loss comes from)."""
    out: dict = {}
    for b in batch_sizes:
        by = {(r.config, r.rep): r.makespan_s for r in runs if r.batch_size == b}
        reps = sorted(
            k
            for c, k in by
            if c == ADAPTIVE and by.get((PLAIN, k)) and by.get((PLAIN_AGAIN, k)) and by[(c, k)]
        )
        if not reps:
            continue
        r = [(by[(PLAIN, k)] + by[(PLAIN_AGAIN, k)]) / 2 / by[(ADAPTIVE, k)] for k in reps]
        aa = [by[(PLAIN, k)] / by[(PLAIN_AGAIN, k)] for k in reps]
        se = statistics.stdev(r) / math.sqrt(len(r)) if len(r) > 1 else None
        per_proc: dict[int, list[float]] = {}
        for k, x in zip(reps, r):
            per_proc.setdefault((k - NEVER_WORSE_REP0) // NEVER_WORSE_PROC_STRIDE, []).append(x)
        pm = [statistics.fmean(v) for _, v in sorted(per_proc.items())]
        p_se = statistics.stdev(pm) / math.sqrt(len(pm)) if len(pm) > 1 else None
        se_v = None if se is None else max(se, p_se or 0.0)
        mean = statistics.fmean(r)
        played = sum(
            (
                Counter(x.strategies)
                for x in runs
                if x.batch_size == b and x.config == ADAPTIVE and x.rep in reps
            ),
            Counter(),
        )
        steps = sum(played.values())
        drafted = [(n, k / steps) for n, k in played.most_common() if n != OFF.name]
        out[str(b)] = {
            "rounds": len(reps),
            "processes": len(pm),
            "ratio_mean": mean,
            "ratio_se": se,
            "process_means": [round(x, 4) for x in pm],
            "process_se": p_se,
            "se_verdict": se_v,
            "ratio_all": [round(x, 4) for x in r],
            "aa_mean": statistics.fmean(aa),
            "aa_se": statistics.stdev(aa) / math.sqrt(len(aa)) if len(aa) > 1 else None,
            "aa_all": [round(x, 4) for x in aa],
            "slowdown_bound": None if se_v is None else 1.0 - (mean - 2.0 * se_v),
            "resolution": None if se_v is None else 2.0 * se_v,
            "not_worse": mean >= 1.0,
            "not_worse_2se": None if se_v is None else mean + 2.0 * se_v >= 1.0,
            "drafted_fraction": sum(x for _, x in drafted) if steps else None,
            "drafted_arms": dict(drafted[:3]),
        }
    return out


def rounds(
    runner: TailspecRunner,
    configs: list[str],
    workloads: dict[int, Workload],
    sampling: dict,
    seed: int,
    reps: int,
    rep0: int,
    label: str,
) -> list[RunResult]:
    """``reps`` lock-step rounds of ``configs`` at every batch size (the first engine rotating), printed."""
    out: list[RunResult] = []
    for rep in range(reps):
        for b, wl in workloads.items():
            k = rep % len(configs)
            t = time.perf_counter()
            rs = run_lockstep(runner, configs[k:] + configs[:k], wl, sampling, seed, rep0 + rep)
            out.extend(rs)
            pm = next(r.makespan_s for r in rs if r.config == PLAIN)
            print(
                f"[longtail] {label} {rep} b={b} ({time.perf_counter() - t:.1f} s): "
                + ", ".join(f"{r.config} {pm / r.makespan_s:.3f}x" for r in rs if r.config != PLAIN),
                flush=True,
            )
    return out


def never_worse_process(args: argparse.Namespace, p: int) -> list[RunResult]:
    """Fresh process ``p`` (1, 2, ...) of the never-worse rounds: this benchmark again with the same arguments,
    restricted to them (no sequential or lock-step rounds, no peers), its rounds numbered from
    ``NEVER_WORSE_REP0 + p * NEVER_WORSE_PROC_STRIDE``. Returns its ``RunResult``s. Raises ``RuntimeError``
    (with the end of its output) if the process fails."""
    with tempfile.TemporaryDirectory(prefix="tailspec-never-worse-") as d:
        out = Path(d) / "runs.pkl"
        cmd = [
            *(sys.executable, "-m", "benchmarks.longtail", *args.argv),
            *("--configs", ADAPTIVE, "--reps", "0", "--lockstep-reps", "0", "--no-peers"),
            *("--never-worse-procs", "0", "--never-worse-child", str(out)),
            *("--never-worse-rep0", str(NEVER_WORSE_REP0 + p * NEVER_WORSE_PROC_STRIDE), "--out-dir", d),
        ]
        t = time.perf_counter()
        print(f"[longtail] never-worse process {p}: starting", flush=True)
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            if "never-worse round" in line:
                print(f"[longtail] (process {p}) " + line.split("] ", 1)[-1], end="", flush=True)
        if proc.wait() != 0 or not out.is_file():
            raise RuntimeError(
                f"never-worse process {p} failed (exit {proc.returncode}): {' '.join(cmd)}\n" + "".join(tail)
            )
        runs = [RunResult(**r) for r in pickle.loads(out.read_bytes())]
    print(f"[longtail] never-worse process {p}: {len(runs)} runs ({time.perf_counter() - t:.0f} s)")
    return runs


def hand_over(runs: list[RunResult], path: Path) -> None:
    """A never-worse child process's rounds, for its parent (``never_worse_process``)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(pickle.dumps([vars(r) for r in runs]))  # plain dicts: __main__ differs
    tmp.replace(path)
