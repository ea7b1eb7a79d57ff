"""Bubble accounting: how much of the rollout long tail's idle time went into drafter training.

The *bubble* of a worker in one RL step is the time from the end of its own rollout share to the end of the
rollout phase (when the last worker finishes): the accelerator has nothing to decode while the long tail runs
elsewhere. TLT ("Taming the Long Tail", arXiv 2511.16665) fills these bubbles with drafter training; this
module measures how well we do.

Contract
--------
- Per (step, worker): ``idle_seconds = max(0, phase_end - rollout_finish)``; ``trained_seconds`` is the time
  spent in TRAINING inside that window (clipped to ``[0, idle_seconds]``: training that runs on into the
  policy update is not bubble time); ``utilization = trained / idle`` (0 when idle is 0).
- Totals (per step, per worker, overall) are ratios of sums, ``sum(trained) / sum(idle)``, not means of
  ratios. ``metrics(step)`` gives the keys for ``metrics.jsonl``: ``bubble_idle_s``, ``bubble_trained_s``,
  ``bubble_utilization``.
- Recording the same (step, worker) again replaces the earlier record.
- ``record_from_timeline`` derives the records from the coordinator's timeline events
  ``(worker, state, t_start, t_end)``: a worker's finish is the end of its last ROLLOUT interval inside the
  phase; workers without a ROLLOUT interval in the phase had no share and get no record.
- ``plot_worker_timeline(events, path)`` draws the Gantt chart (one row per worker, a colored bar per state
  interval, dashed lines at phase boundaries labelled with the step), with matplotlib's Agg canvas (no
  pyplot state, no display needed).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BubbleRecord:
    step: int
    worker: str
    rollout_finish: float
    phase_end: float
    trained_seconds: float

    @property
    def idle_seconds(self) -> float:
        return max(0.0, self.phase_end - self.rollout_finish)

    @property
    def trained(self) -> float:
        return min(max(0.0, self.trained_seconds), self.idle_seconds)

    @property
    def utilization(self) -> float:
        idle = self.idle_seconds
        return self.trained / idle if idle > 0 else 0.0


def _totals(records: Iterable[BubbleRecord]) -> dict[str, float]:
    records = list(records)
    idle = sum(r.idle_seconds for r in records)
    trained = sum(r.trained for r in records)
    return dict(
        idle_seconds=idle,
        trained_seconds=trained,
        bubble_utilization=trained / idle if idle > 0 else 0.0,
        records=len(records),
    )


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state)).upper()


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class BubbleAccounting:
    def __init__(self):
        self._records: dict[tuple[int, str], BubbleRecord] = {}

    @property
    def records(self) -> list[BubbleRecord]:
        return sorted(self._records.values(), key=lambda r: (r.step, r.worker))

    def record(
        self, step: int, worker: str, rollout_finish: float, phase_end: float, trained_seconds: float
    ) -> BubbleRecord:
        r = BubbleRecord(
            int(step), str(worker), float(rollout_finish), float(phase_end), float(trained_seconds)
        )
        self._records[(r.step, r.worker)] = r
        return r

    def record_from_timeline(
        self,
        step: int,
        events: Iterable[Sequence[Any]],
        phase_start: float,
        phase_end: float,
    ) -> list[BubbleRecord]:
        """Records of one rollout phase from ``(worker, state, t_start, t_end)`` timeline events."""
        finish: dict[str, float] = {}
        training: dict[str, list[tuple[float, float]]] = {}
        for worker, state, t0, t1 in (tuple(e)[:4] for e in events):
            name = _state_name(state)
            if name == "ROLLOUT" and _overlap(t0, t1, phase_start, phase_end) > 0:
                finish[worker] = max(finish.get(worker, -math.inf), min(t1, phase_end))
            elif name == "TRAINING":
                training.setdefault(worker, []).append((t0, t1))
        out = []
        for worker in sorted(finish):
            f = finish[worker]
            trained = sum(_overlap(t0, t1, f, phase_end) for t0, t1 in training.get(worker, []))
            out.append(self.record(step, worker, f, phase_end, trained))
        return out

    def step_totals(self, step: int) -> dict[str, float]:
        return _totals(r for r in self._records.values() if r.step == step)

    def per_worker(self) -> dict[str, dict[str, float]]:
        workers = sorted({r.worker for r in self._records.values()})
        return {w: _totals(r for r in self._records.values() if r.worker == w) for w in workers}

    def totals(self) -> dict[str, float]:
        return _totals(self._records.values())

    def metrics(self, step: int) -> dict[str, float]:
        t = self.step_totals(step)
        return dict(
            bubble_idle_s=t["idle_seconds"],
            bubble_trained_s=t["trained_seconds"],
            bubble_utilization=t["bubble_utilization"],
        )


STATE_COLORS = {
    "ROLLOUT": "#1f77b4",
    "IDLE": "#d3d3d3",
    "TRAINING": "#2ca02c",
    "PREEMPTING": "#ff7f0e",
    "STARTING": "#9467bd",
    "FAILED": "#d62728",
    "STOPPED": "#404040",
}
_ALWAYS_IN_LEGEND = ("ROLLOUT", "IDLE", "TRAINING", "PREEMPTING")


def plot_worker_timeline(
    timeline_events: Iterable[Sequence[Any]],
    path: str | os.PathLike,
    phases: Iterable[Sequence[Any]] | None = None,
    title: str = "worker timeline",
) -> Path:
    """Gantt chart of ``(worker, state, t_start, t_end)`` events; ``phases``: ``(step, t_start, t_end)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    events = [
        (str(e[0]), _state_name(e[1]), float(e[2]), float(e[3])) for e in (tuple(x) for x in timeline_events)
    ]
    phases = [
        (int(p[0]), float(p[1]), None if p[2] is None else float(p[2]))
        for p in (tuple(x) for x in phases or [])
    ]
    workers = sorted({e[0] for e in events})
    t_origin = min([e[2] for e in events] + [p[1] for p in phases], default=0.0)
    fig = Figure(figsize=(10, 1.0 + 0.45 * max(1, len(workers))), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    row = {w: i for i, w in enumerate(workers)}
    for w, state, t0, t1 in events:
        if t1 <= t0:
            continue
        ax.broken_barh(
            [(t0 - t_origin, t1 - t0)],
            (row[w] - 0.4, 0.8),
            facecolors=STATE_COLORS.get(state, "#8c564b"),
            edgecolor="none",
        )
    for step, t0, t1 in phases:
        ax.axvline(t0 - t_origin, color="black", linestyle="--", linewidth=0.8)
        ax.text(t0 - t_origin, len(workers) - 0.45, f" step {step}", fontsize=8, va="bottom")
        if t1 is not None:
            ax.axvline(t1 - t_origin, color="black", linestyle=":", linewidth=0.8)
    ax.set_yticks(range(len(workers)), labels=workers)
    ax.set_ylim(-0.6, len(workers) + 0.1)
    ax.set_xlabel("seconds")
    ax.set_title(title)
    present = {e[1] for e in events}
    names = [s for s in STATE_COLORS if s in _ALWAYS_IN_LEGEND or s in present]
    ax.legend(
        handles=[Patch(facecolor=STATE_COLORS[s], label=s.lower()) for s in names],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=len(names),
        frameon=False,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
