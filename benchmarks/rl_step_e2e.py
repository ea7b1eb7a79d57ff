"""End-to-end RL step: the adaptive system (tuner + drafters, and bubble training where the config enables it) vs
speculation off, same seed and prompts, over a whole run; step-time breakdown (rollout, reward, policy update,
weight sync, drafter training in bubbles) and the end-to-end speedup (ratio of total step time).

    python -m benchmarks.rl_step_e2e [--steps 40] [--pairs 2] [--warm-tuner-steps 0] [--config FILE]
        [--out benchmarks/results] [--name rl_step_e2e] [dotted.key=value ...]

The runs train ``--config`` (default: ``make run``'s, ``configs/running_total_tiny.yaml``, all 40 of its steps:
16 of its 64 problems per step, so from step 5 on every problem has earlier responses for the suffix drafter;
bubble training off). Overrides apply to every system, after its own: ``spot.enabled=true --name
rl_step_e2e_spot`` runs both systems with bubble training.

Systems: speculation off (tuner, speculation and bubble training off); ``adaptive`` (the config as it is, a cold
tuner); with ``--warm-tuner-steps N``, ``adaptive_warm`` (the same, its tuner started from the state an unmeasured
N-step run on other prompts left, ``tuner.init_state``: what a user's second run on the same model and machine
gets).

One RL run is stateful, so the systems cannot be interleaved step by step; instead ``--pairs`` rounds of
whole runs alternate in ABBA order (adaptive, warm, off, off, warm, adaptive, ...), so a linear drift of the
machine's load cancels. Reported: the ratio of the summed step times over all runs (``end_to_end_speedup``,
likewise for the rollout phase; ``warm`` holds the same for the warm system), each round's own ratios (the
spread says how far to trust them), and per-run totals; the JSON records the load average at the start of
each run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.machine import describe_machine
from benchmarks.runs import train_rows

WARMUP_SEED = 1  # the tuner warm-up run's seed (the measured runs use the config's, 0)
MAKE_RUN_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "running_total_tiny.yaml"
PHASES = (
    "rollout_seconds",
    "reward_seconds",
    "train_seconds",
    "weight_sync_seconds",
    "bubble_trained_seconds",
)


def _run(run_dir: Path, steps: int, extra: list[str], config: Path) -> dict:
    load = os.getloadavg()
    rows = train_rows(run_dir, steps, extra, config)
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


def _round_result(p: dict) -> dict:
    """One round's ratios (each system against that round's off run) and its runs' results."""
    e2e, rollout = _speedups(p["off"], p["adaptive"])
    out = {
        "end_to_end_speedup": e2e,
        "rollout_speedup": rollout,
        "adaptive": p["adaptive"],
        "speculation_off": p["off"],
    }
    if "adaptive_warm" in p:
        w_e2e, w_rollout = _speedups(p["off"], p["adaptive_warm"])
        out.update(
            warm_end_to_end_speedup=w_e2e, warm_rollout_speedup=w_rollout, adaptive_warm=p["adaptive_warm"]
        )
    return out


def run_order(pair: int, systems: Sequence[str]) -> list[str]:
    """The order of the systems' runs in pair ``pair``: as listed for even pairs, reversed for odd ones
    (A B C, C B A, ...), so that a linear drift of the machine's load cancels over two pairs."""
    return list(systems) if pair % 2 == 0 else list(reversed(systems))


def plot(res: dict, path: Path) -> None:
    """Stacked step-time bars per system (``res``: this benchmark's JSON) with the speedups in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    shown = [("speculation off", res["speculation_off"]), ("adaptive (tuner + drafters)", res["adaptive"])]
    if "adaptive_warm" in res:
        shown.append((f"adaptive, tuner from a {res['warm']['warmup_steps']}-step run", res["adaptive_warm"]))
    names = [n for n, _ in shown]
    left = [0.0] * len(shown)
    for k in PHASES:
        vals = [d["totals"][k] for _, d in shown]
        if k == "bubble_trained_seconds":  # overlaps the rollout phase: drawn apart, hatched
            ax.barh(names, vals, left=left, hatch="//", alpha=0.5, label="drafter training (inside rollout)")
            continue
        ax.barh(names, vals, left=left, label=k.replace("_seconds", ""))
        left = [x + v for x, v in zip(left, vals)]
    ax.set_xlabel(f"seconds over {res['steps']} RL steps (mean of {res['pairs']} run(s) each)")
    spread = ", ".join(f"{p['end_to_end_speedup']:.2f}" for p in res["per_pair"])
    title = (
        f"End-to-end RL step: speedup {res['end_to_end_speedup']:.2f}x "
        f"(rollout {res['rollout_speedup']:.2f}x; rounds {spread})"
    )
    if "warm" in res:
        w = res["warm"]
        title += f"\nwarm tuner: {w['end_to_end_speedup']:.2f}x (rollout {w['rollout_speedup']:.2f}x)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=2, help="rounds of runs (one per system each), ABBA order")
    ap.add_argument(
        "--warm-tuner-steps",
        type=int,
        default=0,
        help="steps of the unmeasured run whose tuner state the adaptive-warm runs start from (0: no such system)",
    )
    ap.add_argument("--config", type=Path, default=MAKE_RUN_CONFIG, help="run config (default: make run's)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="rl_step_e2e", help="output file stem (<out>/<name>.json, .png)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.steps < 1 or a.warm_tuner_steps < 0:
        raise SystemExit(
            f"--pairs and --steps must be >= 1, --warm-tuner-steps >= 0 "
            f"(got {a.pairs}, {a.steps}, {a.warm_tuner_steps})"
        )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = {
        "adaptive": [],
        "off": ["tuner.enabled=false", "rollout.speculative.enabled=false", "spot.enabled=false"],
    }
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        if a.warm_tuner_steps:
            # another seed (other prompts): only the arms' costs on this model and machine carry over
            warm_dir = Path(tmp) / "tuner-warmup"
            print(f"tuner warm-up run: {a.warm_tuner_steps} steps, run.seed={WARMUP_SEED}", flush=True)
            _run(warm_dir, a.warm_tuner_steps, [f"run.seed={WARMUP_SEED}", *a.overrides], a.config)
            state = warm_dir / "checkpoints" / "tuner_state.json"
            if not state.is_file():
                raise SystemExit(f"the tuner warm-up run left no tuner state at {state}")
            extra["adaptive_warm"] = [f"tuner.init_state={state}"]
        systems = [s for s in ("adaptive", "adaptive_warm", "off") if s in extra]
        for i in range(a.pairs):
            runs = {}
            for name in run_order(i, systems):
                print(f"round {i + 1}/{a.pairs}: {name}", flush=True)
                runs[name] = _run(Path(tmp) / f"{name}-{i}", a.steps, [*extra[name], *a.overrides], a.config)
            pairs.append(runs)
    full = _mean_runs([p["adaptive"] for p in pairs])
    off = _mean_runs([p["off"] for p in pairs])
    speedup, rollout_speedup = _speedups(off, full)
    res = {
        "machine": describe_machine(),
        "config": str(a.config),
        "steps": a.steps,
        "pairs": a.pairs,
        "adaptive": full,
        "speculation_off": off,
        "end_to_end_speedup": speedup,
        "rollout_speedup": rollout_speedup,
        "per_pair": [_round_result(p) for p in pairs],
    }
    if "adaptive_warm" in systems:
        warm = _mean_runs([p["adaptive_warm"] for p in pairs])
        w_speedup, w_rollout = _speedups(off, warm)
        res["adaptive_warm"] = warm
        res["warm"] = {
            "end_to_end_speedup": w_speedup,
            "rollout_speedup": w_rollout,
            "warmup_steps": a.warm_tuner_steps,
            "warmup_seed": WARMUP_SEED,
        }
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    plot(res, out / f"{a.name}.png")
    print(
        json.dumps(
            {
                "end_to_end_speedup": speedup,
                "rollout_speedup": rollout_speedup,
                "per_pair": [(p["end_to_end_speedup"], p["rollout_speedup"]) for p in res["per_pair"]],
                "adaptive": full["totals"],
                "off": off["totals"],
                "warm": res.get("warm"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
