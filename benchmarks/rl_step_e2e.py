"""End-to-end RL step: the full adaptive system (tuner + drafters + bubble training) vs speculation off, same
seed and prompts, over several steps; step-time breakdown (rollout, reward, policy update, weight sync, drafter
training in bubbles) and the end-to-end speedup (ratio of total step time).

    python -m benchmarks.rl_step_e2e [--steps 4] [--out benchmarks/results] [dotted.key=value ...]

The two runs go one after the other in this process (not interleaved: one RL run is stateful), so machine-load
drift between them shows up in the ratio; the JSON records the load average at the start of each run.
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = _run(Path(tmp) / "adaptive", a.steps, list(a.overrides))
        off = _run(
            Path(tmp) / "off",
            a.steps,
            ["tuner.enabled=false", "rollout.speculative.enabled=false", "spot.enabled=false", *a.overrides],
        )
    speedup = off["totals"]["step_seconds"] / full["totals"]["step_seconds"]
    rollout_speedup = off["totals"]["rollout_seconds"] / full["totals"]["rollout_seconds"]
    res = {
        "machine": describe_machine(),
        "steps": a.steps,
        "adaptive": full,
        "speculation_off": off,
        "end_to_end_speedup": speedup,
        "rollout_speedup": rollout_speedup,
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
    ax.set_xlabel(f"seconds over {a.steps} RL steps")
    ax.set_title(f"End-to-end RL step: speedup {speedup:.2f}x (rollout {rollout_speedup:.2f}x)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "rl_step_e2e.png", dpi=110)
    print(
        json.dumps(
            {
                "end_to_end_speedup": speedup,
                "rollout_speedup": rollout_speedup,
                "adaptive": full["totals"],
                "off": off["totals"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
