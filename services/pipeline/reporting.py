"""A run's report: the speculative-decoding keys and the progress line of each step, and at the end the
plots, ``summary.json``'s totals and the results table printed to the console.

The functions here read the run's ``metrics.jsonl`` rows (``rows``) and the services' end state; they write
plots and return dicts, the driver writes ``summary.json`` (``services/pipeline/outputs.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from rich.table import Table

from services.pipeline.outputs import (
    length_stats,
    plot_curves,
    plot_dashboard_preview,
    plot_response_lengths,
    plot_tuner_arms,
)
from services.rollout_actor.speculative.stats import LONG_TAIL_BATCH, aggregate, merge_drafters
from services.spot_trainer.bubbles import plot_worker_timeline


# ---------------------------------------------------------------------------------------------- a step's row
def spec_metrics(outputs: list, strategy: str, speedup: dict | None) -> dict:
    """A step's speculative-decoding keys: acceptance statistics of its ``outputs``, the ``strategy``
    (a drafter, or ``tuner``) and the replayed sample's ``speedup`` vs plain decoding (when measured)."""
    m = aggregate(outputs)
    m["strategy"] = strategy
    if speedup:
        m["rollout_speedup_vs_plain"] = speedup["speedup"]
        m["long_tail_speedup_vs_plain"] = speedup.get("long_tail_speedup")
        m["speedup_measurement"] = {
            "method": "replayed sample, speculation off vs on, same worker",
            **speedup,
        }
    return m


# ---------------------------------------------------------------------------------------------- plots
def write_plots(
    plots: Path,
    rows: list[dict],
    lengths_per_step: list[list[int]],
    max_new_tokens: int,
    curve_rows: list[dict],
    eval_curves: bool,
    title: str,
    timeline: tuple[list, list] | None,
) -> None:
    """The run's plots into folder ``plots``: response lengths per step, training curves (of ``curve_rows``,
    with the held-out accuracy when ``eval_curves``), the worker timeline (the coordinator's ``timeline``,
    when there is one), the dashboard preview and, for a run with a tuner, the tuner's arms."""
    plot_response_lengths(lengths_per_step, plots / "response_length.png", max_new_tokens)
    plot_curves(
        curve_rows,
        ["reward_mean", "accuracy", "response_len_mean", "rollout_seconds"]
        + (["eval_accuracy", "eval_accuracy_sampled"] if eval_curves else []),
        plots / "training_curves.png",
        title,
    )
    if timeline is not None:
        events, phases = timeline
        plot_worker_timeline(
            events,
            plots / "worker_timeline.png",
            phases=phases,
            title="rollout / idle / training / preempting per worker",
        )
    plot_dashboard_preview(rows, plots / "dashboard_preview.png")
    if any("tuner" in r for r in rows):
        plot_tuner_arms(rows, plots / "tuner_arms.png")


# ---------------------------------------------------------------------------------------------- summary
def step_totals(rows: list[dict], lengths_per_step: list[list[int]]) -> dict:
    """``summary.json``'s step count, first / last reward and accuracy, time and token totals, and the
    response-length statistics of the whole run."""
    return {
        "steps": len(rows),
        "reward_mean_first": rows[0]["reward_mean"],
        "reward_mean_last": rows[-1]["reward_mean"],
        "accuracy_first": rows[0]["accuracy"],
        "accuracy_last": rows[-1]["accuracy"],
        "rollout_seconds_total": sum(r["rollout_seconds"] for r in rows),
        "train_seconds_total": sum(r["train_seconds"] for r in rows),
        "step_seconds_total": sum(r["step_seconds"] for r in rows),
        "speedup_measure_seconds_total": sum(r.get("speedup_measure_seconds", 0.0) for r in rows),
        "tokens_generated_total": sum(r["tokens_generated"] for r in rows),
        "response_len_max": max(r["response_len_max"] for r in rows),
        **length_stats([n for lens in lengths_per_step for n in lens], "response_len_run_"),
        "rollout_share_of_step": sum(r["rollout_seconds"] for r in rows)
        / max(sum(r["step_seconds"] for r in rows), 1e-9),
    }


def bubble_summary(rows: list[dict], totals: dict, plane) -> dict:
    """Bubble totals (``BubbleAccounting.totals()``), the spot trainer's and the coordinator's end state
    (``plane``: the run's ``ControlPlane``) and the learned drafter's acceptance rate per step."""
    learned = [(r["step"], (r.get("drafters") or {}).get("learned", {}).get("acceptance_rate")) for r in rows]
    return {
        "bubble_seconds_total": totals["idle_seconds"],
        "bubble_trained_seconds_total": totals["trained_seconds"],
        "bubble_utilization": totals["bubble_utilization"],
        "drafter_version": plane.drafter_version,
        "spot_training": bool(plane.spot is not None),
        "spot_replicas": len(plane.spot) if plane.spot is not None else 0,
        "coordinator_restarts": plane.coordinator_restarts,
        "learned_acceptance_rate_by_step": learned,
    }


def tuner_summary(rows: list[dict], init_state: str | None) -> dict:
    """The tuner's totals over the run (``{}`` without a tuner); ``init_state``: the earlier run's tuner
    state it started from."""
    rows = [r["tuner"] for r in rows if "tuner" in r]
    if not rows:
        return {}
    choices: dict[str, int] = {}
    for t in rows:
        for a, c in t["choices"].items():
            choices[a] = choices.get(a, 0) + c
    return {
        "tuner": {
            "table_version": rows[-1]["table_version"],
            "init_state": init_state,
            "observations_total": sum(t["observations"] for t in rows),
            "choices_total": choices,
            "best_by_bucket": rows[-1]["best_by_bucket"],
            "exploration_fraction": rows[-1]["exploration_fraction"],
            "arm_reward_median": rows[-1]["arm_reward_median"],
        }
    }


def spec_summary(rows: list[dict], strategy: str) -> dict:
    """Speculative decoding over the run (``{}`` without it): acceptance, per-drafter statistics and the
    measured speed-ups vs plain decoding."""
    rows = [r for r in rows if "drafted_tokens" in r]
    if not rows:
        return {}
    drafted = sum(r["drafted_tokens"] for r in rows)
    accepted = sum(r["accepted_tokens"] for r in rows)
    verify = sum(r["verify_steps"] for r in rows)
    speedups = [r["rollout_speedup_vs_plain"] for r in rows if r.get("rollout_speedup_vs_plain")]
    tails = [r["long_tail_speedup_vs_plain"] for r in rows if r.get("long_tail_speedup_vs_plain")]
    steps = [r["step_speedup_vs_plain"] for r in rows if r.get("step_speedup_vs_plain")]
    return {
        "speculative_strategy": strategy,
        "drafted_tokens_total": drafted,
        "accepted_tokens_total": accepted,
        "acceptance_length_mean": (accepted + verify) / verify if verify else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "drafters": merge_drafters(rows),
        "rollout_speedup_vs_plain": float(np.median(speedups)) if speedups else None,
        "rollout_speedup_vs_plain_method": "median over the measured steps (step 1 and every "
        "rollout.speculative.speedup_every-th) of a replayed sample of the step's prompts, speculation off vs on "
        "on the same worker (not the live rollout)",
        "speedup_measurements": len(speedups),
        "long_tail_speedup_vs_plain": float(np.median(tails)) if tails else None,
        "long_tail_speedup_vs_plain_method": "the same replayed samples, seconds for the rollout's last N tokens, "
        f"N = those plain decoding commits with <= {LONG_TAIL_BATCH} active requests (stats.long_tail_speedup)",
        "step_speedup_vs_plain": float(np.median(steps)) if steps else None,
        "step_speedup_vs_plain_method": "median over the measured steps of step seconds with the rollout scaled by the "
        "replayed sample's speedup, over step seconds",
    }


# ---------------------------------------------------------------------------------------------- console
class Progress:
    """One progress line per RL step (to the rich ``console``, else plain print)."""

    def __init__(self, console, total: int):
        self.console, self.total = console, total

    def update(self, r: dict) -> None:
        msg = (
            f"step {r['step']}/{self.total}  reward {r['reward_mean']:.3f}  acc {r['accuracy']:.3f}  "
            f"len p50/p90/max {r['response_len_p50']:.0f}/{r['response_len_p90']:.0f}/{r['response_len_max']}  "
            f"rollout {r['rollout_seconds']:.1f}s  train {r['train_seconds']:.1f}s  "
            f"step {r['step_seconds']:.1f}s  v{r['policy_version']}"
        )
        if r.get("acceptance_length_mean"):
            msg += f"  tau {r['acceptance_length_mean']:.2f}"
        if r.get("long_tail_speedup_vs_plain"):
            msg += f"  tail x{r['long_tail_speedup_vs_plain']:.2f}"
        if self.console is not None:
            self.console.print(msg, soft_wrap=True)  # one line per step, however wide the terminal or log
        else:
            print(msg)

    def close(self) -> None:
        pass


def result_rows(summary: dict) -> list[tuple[str, str]]:
    """The run's results as ``(what, value)`` lines, from ``summary.json``'s keys (a key the run lacks, e.g.
    speculation when it was off, leaves its line out): held-out accuracy and reward first -> last, response
    lengths, time, speculation and its measured speed-ups, the tuner's most played arms, bubbles, the files."""
    s, out = summary, []
    if s.get("eval_accuracy_first") is not None:
        acc = f"{s['eval_accuracy_first']:.3f} -> {s['eval_accuracy_last']:.3f}"
        out.append((f"held-out accuracy, greedy ({s['eval_problems']} problems)", acc))
        if s.get("eval_accuracy_sampled_first") is not None:
            acc = f"{s['eval_accuracy_sampled_first']:.3f} -> {s['eval_accuracy_sampled_last']:.3f}"
            out.append((f"held-out accuracy, T={s.get('eval_temperature', 1.0):g}", acc))
    reward = f"{s['reward_mean_first']:.3f} -> {s['reward_mean_last']:.3f}"
    out.append((f"reward (batch mean), step 1 -> {s['steps']}", reward))
    lens = "/".join(f"{s[f'response_len_run_{q}']:.0f}" for q in ("p50", "p90", "p99", "max"))
    out.append(("response tokens p50/p90/p99/max", f"{lens} ({s['tokens_generated_total']:,} generated)"))
    secs = f"{s['wall_seconds']:.1f} s; RL steps {s['step_seconds_total']:.1f} s, of which rollout "
    out.append(
        ("time", secs + f"{s['rollout_seconds_total']:.1f} s, policy update {s['train_seconds_total']:.1f} s")
    )
    if s.get("acceptance_length_mean"):
        tau = f"{s['acceptance_length_mean']:.2f} (acceptance rate {s['acceptance_rate']:.2f})"
        out.append(("tau (accepted draft tokens + 1 per verify step)", tau))
    if s.get("rollout_speedup_vs_plain"):
        x = [f"rollout {s['rollout_speedup_vs_plain']:.2f}x"]
        x += (
            [f"long tail {s['long_tail_speedup_vs_plain']:.2f}x"]
            if s.get("long_tail_speedup_vs_plain")
            else []
        )
        x += [f"RL step {s['step_speedup_vs_plain']:.2f}x"] if s.get("step_speedup_vs_plain") else []
        out.append((f"vs plain decoding (median of {s['speedup_measurements']} replays)", ", ".join(x)))
    if s.get("tuner"):
        choices = s["tuner"]["choices_total"]
        top = sorted(choices.items(), key=lambda kv: -kv[1])[:3]
        arms = ", ".join(f"{a} {c / max(1, sum(choices.values())):.0%}" for a, c in top)
        out.append(("tuner: decode steps per arm (top 3)", arms))
    if s.get("spot_training"):
        bubbles = f"{s['bubble_trained_seconds_total']:.1f} of {s['bubble_seconds_total']:.1f} worker-seconds"
        out.append(("idle bubbles spent training the drafter", bubbles))
    files = ["summary.json", "metrics.jsonl", "plots/"]
    files += [os.path.relpath(s["checkpoint"], s["run_dir"])] if s.get("checkpoint") else []
    out.append(("files (in the run directory)", ", ".join(files)))
    return out


def print_results(console, summary: dict) -> None:
    """The run's results (``result_rows``) as a two-column table (rich, to ``console`` when given; plain lines
    otherwise)."""
    rows = result_rows(summary)
    if console is None:
        for what, value in rows:
            print(f"{what}: {value}")
        return
    t = Table(title=f"tailspec run {summary['run_dir']}", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for what, value in rows:
        t.add_row(what, value)
    console.print(t)
