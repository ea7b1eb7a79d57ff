"""Run outputs: ``runs/<run_id>/{config.yaml, metrics.jsonl, summary.json, plots/*.png, checkpoints/}``.

``summary.json`` is written last, atomically, and only when the run succeeds; ``metrics.jsonl`` gets one
JSON object per RL step, flushed as the step ends so a crashed run keeps its history.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np


def new_run_id(name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{os.getpid()}"


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunWriter:
    """The run folder's files. ``resume_after`` (a resumed run): keep ``metrics.jsonl``'s rows of steps
    ``<= resume_after`` (rewritten atomically) instead of starting it empty."""

    def __init__(self, run_dir: Path, resume_after: int | None = None):
        self.dir = Path(run_dir)
        if (self.dir / "summary.json").exists():
            raise FileExistsError(f"run directory {self.dir} already holds a finished run (summary.json)")
        (self.dir / "plots").mkdir(parents=True, exist_ok=True)
        (self.dir / "checkpoints").mkdir(exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        kept = (
            [r for r in self.read_metrics() if r["step"] <= resume_after] if resume_after is not None else []
        )
        atomic_write_text(self.metrics_path, "".join(json.dumps(r, default=_jsonable) + "\n" for r in kept))

    def read_metrics(self) -> list[dict]:
        """The rows of ``metrics.jsonl`` (a torn last line, from a process killed mid-write, is dropped)."""
        if not self.metrics_path.exists():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return rows

    def write_config(self, yaml_text: str) -> None:
        atomic_write_text(self.dir / "config.yaml", yaml_text)

    def append_metrics(self, row: dict) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row, default=_jsonable) + "\n")
            f.flush()

    def write_summary(self, summary: dict) -> None:
        atomic_write_text(self.dir / "summary.json", json.dumps(summary, indent=2, default=_jsonable) + "\n")

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.dir / name, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


def length_stats(lengths: list[int], prefix: str = "response_len_") -> dict:
    """Mean, p50, p90, p99, max of response lengths; with another ``prefix`` (the run's pooled lengths in
    summary.json) also ``tail_ratio`` = p99 / p50."""
    a = np.asarray(lengths, dtype=float) if lengths else np.zeros(1)
    out = {
        f"{prefix}mean": float(a.mean()),
        f"{prefix}p50": float(np.percentile(a, 50)),
        f"{prefix}p90": float(np.percentile(a, 90)),
        f"{prefix}p99": float(np.percentile(a, 99)),
        f"{prefix}max": int(a.max()),
    }
    if prefix != "response_len_":
        out[f"{prefix}tail_ratio"] = out[f"{prefix}p99"] / max(out[f"{prefix}p50"], 1e-9)
    return out


def plot_response_lengths(
    lengths_per_step: list[list[int]], path: Path, max_new_tokens: int | None = None
) -> None:
    """Histogram of response lengths per RL step (one row per step) plus p50/p90/max markers: the tail shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(lengths_per_step)
    fig, axes = plt.subplots(n, 1, figsize=(7, 1.3 + 1.1 * n), sharex=True, squeeze=False)
    top = max((max(x) for x in lengths_per_step if x), default=1)
    bins = np.linspace(0, top + 1, 40)
    for i, (ax, lens) in enumerate(zip(axes[:, 0], lengths_per_step)):
        ax.hist(lens, bins=bins, color="tab:blue", alpha=0.8)
        if lens:
            for q, c in ((50, "tab:green"), (90, "tab:orange")):
                ax.axvline(np.percentile(lens, q), color=c, lw=1.2, label=f"p{q}")
            ax.axvline(max(lens), color="tab:red", lw=1.2, label="max")
        if max_new_tokens:
            ax.axvline(max_new_tokens, color="gray", ls=":", lw=1)
        ax.set_ylabel(f"step {i + 1}", rotation=0, ha="right", va="center")
        ax.set_yticks([])
        if i == 0:
            ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("response length (tokens)")
    fig.suptitle("Response length per RL step (long tail: p90 and max vs median)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(rows: list[dict], keys: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3), squeeze=False)
    for ax, k in zip(axes[0], keys):  # a key missing from some rows (evaluations): its points joined
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tuner_arms(rows: list[dict], path: Path) -> None:
    """Tuner: arm choices per RL step (stacked share of decode steps) and the best arm per batch-size bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tuned = [r for r in rows if "tuner" in r]
    steps = [r["step"] for r in tuned]
    arms = sorted(
        {a for r in tuned for a in r["tuner"]["choices"]}
        | {a for r in tuned for a in r["tuner"]["best_by_bucket"].values()}
    )
    buckets = sorted(
        {b for r in tuned for b in r["tuner"]["best_by_bucket"]},
        key=lambda b: int(b.split("-")[0].rstrip("+")),
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2))
    bottom = np.zeros(len(tuned))
    cmap = plt.get_cmap("tab20")
    for k, a in enumerate(arms):
        tot = np.array([max(1, sum(r["tuner"]["choices"].values())) for r in tuned], dtype=float)
        v = np.array([r["tuner"]["choices"].get(a, 0) for r in tuned], dtype=float) / tot
        ax1.bar(steps, v, bottom=bottom, color=cmap(k % 20), label=a)
        bottom += v
    ax1.set_xlabel("RL step")
    ax1.set_ylabel("share of decode steps")
    ax1.set_title("arm chosen (all buckets; exploration included)")
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    grid = np.full((len(buckets), len(tuned)), np.nan)
    for j, r in enumerate(tuned):
        for i, b in enumerate(buckets):
            best = r["tuner"]["best_by_bucket"].get(b)
            if best is not None:
                grid[i, j] = arms.index(best)
    ax2.imshow(
        grid,
        aspect="auto",
        cmap=matplotlib.colors.ListedColormap([cmap(k % 20) for k in range(len(arms))]),
        vmin=-0.5,
        vmax=len(arms) - 0.5,
        origin="lower",
    )
    ax2.set_yticks(range(len(buckets)), [f"batch {b}" for b in buckets])
    ax2.set_xticks(range(len(tuned)), steps)
    ax2.set_xlabel("RL step")
    ax2.set_title("best arm per active-batch bucket (colors as left)")
    explo = [r["tuner"]["exploration_fraction"] for r in tuned]
    fig.suptitle(f"Tuner: exploration fraction {explo[-1]:.2f} at the last step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_dashboard_preview(rows: list[dict], path: Path) -> None:
    """The Grafana dashboards' main panels (long tail, speculation, bubbles, health) drawn from a run's
    metrics.jsonl rows, for readers without a Grafana at hand."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(2, 3, figsize=(15, 7.5))

    def get(k):
        return [r.get(k) if r.get(k) is not None else np.nan for r in rows]

    a = ax[0, 0]
    for k, lab in (("response_len_p50", "p50"), ("response_len_p90", "p90"), ("response_len_max", "max")):
        a.plot(steps, get(k), marker="o", label=lab)
    a.set_title("Long tail: response length (tokens)")
    a.legend(fontsize=8)
    a = ax[0, 1]
    bottom = np.zeros(len(rows))
    for k in ("rollout_seconds", "reward_seconds", "train_seconds", "weight_sync_seconds"):
        v = np.nan_to_num(np.array(get(k), dtype=float))
        a.bar(steps, v, bottom=bottom, label=k.replace("_seconds", ""))
        bottom += v
    a.set_title("Long tail: step phase seconds")
    a.legend(fontsize=8)
    a = ax[0, 2]
    names = sorted({n for r in rows for n in (r.get("drafters") or {})})
    for n in names:
        a.plot(
            steps,
            [((r.get("drafters") or {}).get(n) or {}).get("acceptance_rate") or np.nan for r in rows],
            marker="o",
            label=n,
        )
    a.set_title("Speculation: acceptance rate by drafter")
    if names:
        a.legend(fontsize=8)
    a = ax[1, 0]
    a.plot(steps, get("acceptance_length_mean"), marker="o", label="acceptance length tau")
    a.plot(steps, get("rollout_speedup_vs_plain"), marker="s", label="speedup vs plain (replayed sample)")
    a.axhline(1.0, color="gray", lw=0.8, ls=":")
    a.set_title("Speculation: tau and measured speedup")
    a.legend(fontsize=8)
    a = ax[1, 1]
    a.bar(np.array(steps) - 0.2, np.nan_to_num(get("bubble_seconds")), width=0.4, label="bubble (idle) s")
    a.bar(np.array(steps) + 0.2, np.nan_to_num(get("bubble_trained_seconds")), width=0.4, label="trained s")
    a2 = a.twinx()
    a2.plot(steps, get("bubble_utilization"), color="black", marker="o", label="utilization")
    a2.set_ylim(0, 1.05)
    a.set_title("Bubbles: idle vs trained seconds, utilization")
    a.legend(fontsize=8, loc="upper left")
    a = ax[1, 2]
    a.plot(steps, get("reward_mean"), marker="o", label="reward mean")
    a.plot(steps, get("accuracy"), marker="s", label="accuracy")
    a3 = a.twinx()
    a3.step(steps, get("policy_version"), where="mid", color="gray", label="policy version")
    a3.step(steps, get("drafter_version"), where="mid", color="purple", label="drafter version")
    a.set_title("Health: reward, accuracy; versions (right)")
    a.legend(fontsize=8, loc="upper left")
    a3.legend(fontsize=8, loc="lower right")
    for a in ax.flat:
        a.set_xlabel("RL step")
        a.grid(alpha=0.3)
    fig.suptitle("tailspec dashboards (preview from metrics.jsonl)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
