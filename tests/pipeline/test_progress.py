"""The console's progress line (``reporting.Progress``): one line per RL step, with tau and the tail speed-up
when the step has them, however narrow the console."""

from __future__ import annotations

import io

from rich.console import Console

from services.pipeline.reporting import Progress

ROW = {
    "step": 36,
    "reward_mean": 0.569,
    "accuracy": 0.469,
    "response_len_p50": 50,
    "response_len_p90": 84,
    "response_len_max": 198,
    "rollout_seconds": 1.0,
    "train_seconds": 0.6,
    "step_seconds": 1.8,
    "policy_version": 36,
}


def test_a_step_line_is_one_line_and_names_tau_and_the_tail_speedup_when_measured():
    out = io.StringIO()
    progress = Progress(Console(file=out, width=60, highlight=False), total=40)
    progress.update({**ROW, "acceptance_length_mean": 1.42, "long_tail_speedup_vs_plain": 0.96})
    progress.update(ROW)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("step 36/40") and lines[0].endswith("v36  tau 1.42  tail x0.96")
    assert lines[1].endswith("v36")
