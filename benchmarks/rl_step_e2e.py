"""End-to-end RL step: the full adaptive system (tuner + drafters + bubble training) vs speculation off, same
seed and prompts, over several steps; step-time breakdown (rollout, reward, policy update, weight sync, drafter
training in bubbles) and the end-to-end speedup (ratio of total step time).

    python -m benchmarks.rl_step_e2e [--steps 4] [--pairs 2] [--out benchmarks/results] [dotted.key=value ...]

One RL run is stateful, so the two systems cannot be interleaved step by step; instead ``--pairs`` pairs of
whole runs alternate in ABBA order (adaptive, off, off, adaptive, ...), so a linear drift of the machine's load
cancels. Reported: the ratio of the summed step times over all runs (``end_to_end_speedup``, likewise for
the rollout phase), each pair's own ratio (the spread says how far to trust it), and per-run totals; the JSON
records the load average at the start of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.machine import describe_machine
from benchmarks.runs import train_rows

PHASES = (
    "rollout_seconds",
    "reward_seconds",
    "train_seconds",
    "weight_sync_seconds",
    "bubble_trained_seconds",
)


def _run(run_dir: Path, steps: int, extra: list[str]) -> dict:
    load = os.getloadavg()
    rows = train_rows(run_dir, steps, extra)
    return {
        "load_avg_at_start": load,
        "steps": [{k: r.get(k) for k in ("step", "step_seconds", *PHASES, "tokens_generated")} for r in rows],
        "totals": {
            k: sum(r.get(k) or 0.0 for r in rows) for k in ("step_seconds", *PHASES, "tokens_generated")
        },
    }


def _mean_runs(runs: list[dict]) -> dict:
    """Per-run mean of each total over ``runs`` (``_run`` results); ``steps`` of the first run."""
    keys = runs[0]["totals"]
    return {
        "runs": len(runs),
        "steps": runs[0]["steps"],
        "totals": {k: sum(r["totals"][k] for r in runs) / len(runs) for k in keys},
    }


def _speedups(off: dict, full: dict) -> tuple[float, float]:
    """(end to end, rollout phase): speculation off's total seconds / the adaptive system's."""
    o, f = off["totals"], full["totals"]
    return o["step_seconds"] / f["step_seconds"], o["rollout_seconds"] / f["rollout_seconds"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=2, help="pairs of runs (adaptive + off), ABBA order")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.steps < 1:
        raise SystemExit(f"--pairs and --steps must be >= 1 (got {a.pairs}, {a.steps})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    off_overrides = ["tuner.enabled=false", "rollout.speculative.enabled=false", "spot.enabled=false"]
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            runs = {}
            for name in ("adaptive", "off") if i % 2 == 0 else ("off", "adaptive"):
                extra = off_overrides if name == "off" else []
                runs[name] = _run(Path(tmp) / f"{name}-{i}", a.steps, [*extra, *a.overrides])
            pairs.append(runs)
    full = _mean_runs([p["adaptive"] for p in pairs])
    off = _mean_runs([p["off"] for p in pairs])
    speedup, rollout_speedup = _speedups(off, full)
    res = {
        "machine": describe_machine(),
        "steps": a.steps,
        "pairs": a.pairs,
        "adaptive": full,
        "speculation_off": off,
        "end_to_end_speedup": speedup,
        "rollout_speedup": rollout_speedup,
        "per_pair": [
            dict(
                zip(("end_to_end_speedup", "rollout_speedup"), _speedups(p["off"], p["adaptive"])),
                adaptive=p["adaptive"],
                speculation_off=p["off"],
            )
            for p in pairs
        ],
    }
    (out / "rl_step_e2e.json").write_text(json.dumps(res, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = ("speculation off", "adaptive (tuner + bubbles)")
    left = [0.0, 0.0]
    for k in PHASES:
        vals = [off["totals"][k], full["totals"][k]]
        if k == "bubble_trained_seconds":  # overlaps the rollout phase: drawn apart, hatched
            ax.barh(names, vals, left=left, hatch="//", alpha=0.5, label="drafter training (inside rollout)")
            continue
        ax.barh(names, vals, left=left, label=k.replace("_seconds", ""))
        left = [x + v for x, v in zip(left, vals)]
    ax.set_xlabel(f"seconds over {a.steps} RL steps (mean of {a.pairs} run(s) each)")
    spread = ", ".join(f"{p['end_to_end_speedup']:.2f}" for p in res["per_pair"])
    ax.set_title(
        f"End-to-end RL step: speedup {speedup:.2f}x (rollout {rollout_speedup:.2f}x; pairs {spread})",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "rl_step_e2e.png", dpi=110)
    print(
        json.dumps(
            {
                "end_to_end_speedup": speedup,
                "rollout_speedup": rollout_speedup,
                "per_pair": [(p["end_to_end_speedup"], p["rollout_speedup"]) for p in res["per_pair"]],
                "adaptive": full["totals"],
                "off": off["totals"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
