"""Bubble accounting arithmetic, derivation from the coordinator's timeline, and the Gantt chart."""

from __future__ import annotations

import pytest

from services.coordinator import Coordinator
from services.spot_trainer.bubbles import BubbleAccounting, plot_worker_timeline


def test_utilization_arithmetic():
    acc = BubbleAccounting()
    r = acc.record(1, "w0", rollout_finish=10.0, phase_end=30.0, trained_seconds=15.0)
    assert (r.idle_seconds, r.trained, r.utilization) == (20.0, 15.0, 0.75)
    r = acc.record(1, "w1", rollout_finish=25.0, phase_end=30.0, trained_seconds=9.0)  # clipped to idle
    assert (r.idle_seconds, r.trained, r.utilization) == (5.0, 5.0, 1.0)
    r = acc.record(1, "w2", rollout_finish=30.0, phase_end=30.0, trained_seconds=0.0)  # the long tail itself
    assert (r.idle_seconds, r.utilization) == (0.0, 0.0)
    acc.record(2, "w0", rollout_finish=0.0, phase_end=10.0, trained_seconds=0.0)
    # ratio of sums, not mean of ratios
    assert acc.step_totals(1) == dict(
        idle_seconds=25.0, trained_seconds=20.0, bubble_utilization=0.8, records=3
    )
    assert acc.metrics(1) == dict(bubble_idle_s=25.0, bubble_trained_s=20.0, bubble_utilization=0.8)
    assert acc.totals()["bubble_utilization"] == pytest.approx(20.0 / 35.0)
    assert acc.per_worker()["w0"]["bubble_utilization"] == pytest.approx(15.0 / 30.0)
    acc.record(2, "w0", rollout_finish=0.0, phase_end=10.0, trained_seconds=10.0)  # replaces
    assert len(acc.records) == 4 and acc.step_totals(2)["bubble_utilization"] == 1.0
    assert BubbleAccounting().totals()["bubble_utilization"] == 0.0


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def run_one_step(tmp_path=None):
    """Two workers: w0 finishes at t=2, trains 2..5 (preempted at 5 for the policy update, stopped at 5.5);
    w1 is the long tail and finishes at t=6."""
    clock = Clock()
    c = Coordinator(heartbeat_timeout_s=100, min_fresh_samples=1, clock=clock)
    for w in ("w0", "w1"):
        c.register(w)
        c.ready(w)
    c.buffer_ready(10)  # both idle at start: granted, then taken back for the rollout
    c.request_resources(["w0", "w1"], "rollout")
    c.training_stopped("w0")
    c.training_stopped("w1")
    clock.t = 0.5
    c.phase_started(1)
    c.rollout_started("w0")
    c.rollout_started("w1")
    clock.t = 2.0
    c.release(["w0"])
    assert c.rollout_finished("w0") is not None
    clock.t = 5.0
    c.request_resources(["w0"], "rollout")
    clock.t = 5.5
    c.training_stopped("w0")
    clock.t = 6.0
    c.rollout_finished("w1")
    clock.t = 7.0
    return c


def test_record_from_coordinator_timeline():
    c = run_one_step()
    phase = c.phases[-1]
    assert (phase.step, phase.t_start, phase.t_end) == (1, 0.5, 6.0)
    acc = BubbleAccounting()
    recs = acc.record_from_timeline(phase.step, c.timeline(), phase.t_start, phase.t_end)
    by = {r.worker: r for r in recs}
    assert (by["w0"].rollout_finish, by["w0"].idle_seconds, by["w0"].trained) == (2.0, 4.0, 3.0)
    assert by["w0"].utilization == 0.75  # PREEMPTING 5..5.5 is not counted as training
    assert (by["w1"].idle_seconds, by["w1"].utilization) == (0.0, 0.0)
    assert acc.step_totals(1)["bubble_utilization"] == 0.75


def test_plot_worker_timeline(tmp_path):
    c = run_one_step()
    path = plot_worker_timeline(c.timeline(), tmp_path / "plots" / "timeline.png", phases=c.phases)
    assert path.exists() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = plot_worker_timeline([], tmp_path / "empty.png")
    assert empty.exists()
