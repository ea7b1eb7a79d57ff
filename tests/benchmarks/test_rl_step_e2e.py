"""benchmarks/rl_step_e2e.py: the run order cancels a linear drift; the summary renders the warm-tuner system."""

import json

from benchmarks.rl_step_e2e import _speedups, run_order
from benchmarks.run_all import e2e_markdown


def test_run_order_reverses_every_other_round_so_a_linear_drift_cancels():
    systems = ["adaptive", "adaptive_warm", "off"]
    assert run_order(0, systems) == systems
    assert run_order(1, systems) == ["off", "adaptive_warm", "adaptive"]
    # over two rounds every system's mean slot is the same: a load rising linearly adds the same to each
    slots = {s: run_order(0, systems).index(s) + run_order(1, systems).index(s) for s in systems}
    assert len(set(slots.values())) == 1


def _totals(step, rollout):
    keys = ("reward_seconds", "train_seconds", "weight_sync_seconds", "bubble_trained_seconds")
    return {
        "totals": {
            "step_seconds": step,
            "rollout_seconds": rollout,
            "tokens_generated": 100,
            **dict.fromkeys(keys, 1.0),
        }
    }


def test_e2e_markdown_shows_the_warm_tuner_column_and_ratios(tmp_path):
    off, cold, warm = _totals(60.0, 12.0), _totals(66.0, 15.0), _totals(62.0, 13.0)
    e2e, rollout = _speedups(off, warm)
    assert (round(e2e, 4), round(rollout, 4)) == (round(60 / 62, 4), round(12 / 13, 4))
    d = {
        "steps": 4,
        "pairs": 1,
        "adaptive": cold,
        "speculation_off": off,
        "adaptive_warm": warm,
        "end_to_end_speedup": 60 / 66,
        "rollout_speedup": 12 / 15,
        "warm": {"end_to_end_speedup": e2e, "rollout_speedup": rollout, "warmup_steps": 4, "warmup_seed": 1},
        "per_pair": [
            {
                "end_to_end_speedup": 60 / 66,
                "rollout_speedup": 12 / 15,
                "warm_end_to_end_speedup": e2e,
                "warm_rollout_speedup": rollout,
            }
        ],
    }
    f = tmp_path / "rl_step_e2e.json"
    f.write_text(json.dumps(d))
    md = e2e_markdown(f)
    assert "adaptive, warm tuner |" in md
    assert "| rollout_seconds | 12.0 | 15.0 | 13.0 |" in md
    assert "end-to-end 0.97x, rollout 0.92x" in md  # the warm system's ratios
    # without a warm system (older results) the table keeps two columns
    for k in ("adaptive_warm", "warm"):
        del d[k]
    f.write_text(json.dumps(d))
    assert "| rollout_seconds | 12.0 | 15.0 |\n" in e2e_markdown(f)
