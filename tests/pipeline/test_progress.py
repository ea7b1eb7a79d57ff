"""The console's report: one progress line per RL step (``reporting.Progress``), with tau and the tail speed-up
when the step has them, however narrow the console; and the results table at the end (``print_results``)."""

from __future__ import annotations

import io

from rich.console import Console

from services.pipeline.reporting import Progress, print_results, result_rows

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


SUMMARY = {
    "run_dir": "runs/20261205-001632-running_total_tiny-8086",
    "steps": 40,
    "reward_mean_first": 0.42,
    "reward_mean_last": 1.013,
    "tokens_generated_total": 293158,
    "response_len_run_p50": 36.0,
    "response_len_run_p90": 126.0,
    "response_len_run_p99": 234.0,
    "response_len_run_max": 284,
    "wall_seconds": 116.8,
    "step_seconds_total": 66.4,
    "rollout_seconds_total": 27.4,
    "train_seconds_total": 35.4,
    "checkpoint": "runs/20261205-001632-running_total_tiny-8086/checkpoints/policy",
    "eval_problems": 300,
    "eval_accuracy_first": 0.033,
    "eval_accuracy_last": 0.973,
    "eval_temperature": 1.0,
    "eval_accuracy_sampled_first": 0.277,
    "eval_accuracy_sampled_last": 0.953,
}
SPECULATION = {
    "acceptance_length_mean": 10.71,
    "acceptance_rate": 0.845,
    "rollout_speedup_vs_plain": 2.39,
    "speedup_measurements": 8,
    "long_tail_speedup_vs_plain": 2.82,
    "step_speedup_vs_plain": 1.49,
    "tuner": {"choices_total": {"off": 2870, "suffix-k4-w1": 624, "suffix-k8-w1": 300, "ngram-k3-w1": 4}},
}


def test_the_results_table_names_what_the_run_learned_how_fast_it_decoded_and_where_its_files_are():
    out = io.StringIO()
    print_results(Console(file=out, width=120, highlight=False), {**SUMMARY, **SPECULATION})
    text = out.getvalue()
    lines = dict(result_rows({**SUMMARY, **SPECULATION}))
    assert lines["held-out accuracy, greedy (300 problems)"] == "0.033 -> 0.973"
    assert lines["held-out accuracy, T=1"] == "0.277 -> 0.953"
    assert lines["reward (batch mean), step 1 -> 40"] == "0.420 -> 1.013"
    assert lines["response tokens p50/p90/p99/max"] == "36/126/234/284 (293,158 generated)"
    assert lines["vs plain decoding (median of 8 replays)"] == "rollout 2.39x, long tail 2.82x, RL step 1.49x"
    assert lines["tuner: decode steps per arm (top 3)"] == "off 76%, suffix-k4-w1 16%, suffix-k8-w1 8%"
    files = "summary.json, metrics.jsonl, plots/, checkpoints/policy"
    assert lines["files (in the run directory)"] == files
    for what, value in lines.items():  # every line reaches the console, none cut (values fold)
        assert what in text and value.replace(" ", "")[:20] in text.replace(" ", "").replace("\n", ""), what


def test_a_run_without_speculation_or_evaluation_leaves_their_lines_out():
    plain = {k: v for k, v in SUMMARY.items() if not k.startswith("eval_") and k != "checkpoint"}
    lines = dict(result_rows(plain))
    assert not any("accuracy" in k or "plain decoding" in k or "tau" in k or "tuner" in k for k in lines), (
        lines
    )
    assert "reward (batch mean), step 1 -> 40" in lines and "time" in lines
    out = io.StringIO()
    print_results(Console(file=out, width=80), plain)
    assert "tailspec run runs/20261205-001632-running_total_tiny-8086" in out.getvalue()
    assert lines["files (in the run directory)"] == "summary.json, metrics.jsonl, plots/"
