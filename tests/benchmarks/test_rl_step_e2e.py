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


def test_main_writes_json_and_png_with_every_system(tmp_path, monkeypatch):
    """The whole driver with the training runs faked: run order, warm-up hand-over and the files written."""
    import benchmarks.rl_step_e2e as e2e

    calls = []
    seconds = {"adaptive": 66.0, "adaptive_warm": 62.0, "off": 60.0}

    def fake_run(run_dir, steps, overrides, config):
        name = run_dir.name.rsplit("-", 1)[0]
        calls.append((name, steps, list(overrides), config))
        if name == "tuner":  # the warm-up run leaves its tuner state behind
            (run_dir / "checkpoints").mkdir(parents=True)
            (run_dir / "checkpoints" / "tuner_state.json").write_text("{}")
            return {}
        system = "adaptive_warm" if any(o.startswith("tuner.init_state=") for o in overrides) else name
        if "tuner.enabled=false" in overrides:
            system = "off"
        step = {
            "step": 1,
            "step_seconds": seconds[system],
            "tokens_generated": 10,
            **dict.fromkeys(e2e.PHASES, 1.0),
        }
        return {
            "load_avg_at_start": (0, 0, 0),
            "steps": [step],
            "totals": {k: v for k, v in step.items() if k != "step"},
        }

    monkeypatch.setattr(e2e, "_run", fake_run)
    e2e.main(["--steps", "3", "--pairs", "2", "--warm-tuner-steps", "2", "--out", str(tmp_path), "x.y=1"])
    names = [c[0] for c in calls]
    assert names == ["tuner", "adaptive", "adaptive_warm", "off", "off", "adaptive_warm", "adaptive"]
    assert calls[0][1] == 2 and "run.seed=1" in calls[0][2]  # the warm-up: its own steps and seed
    assert all(c[1] == 3 and c[2][-1] == "x.y=1" for c in calls[1:])  # user overrides reach every run
    assert {c[3].name for c in calls} == {"running_total_tiny.yaml"}  # make run's config by default
    d = json.loads((tmp_path / "rl_step_e2e.json").read_text())
    assert round(d["end_to_end_speedup"], 6) == round(60 / 66, 6)
    assert round(d["warm"]["end_to_end_speedup"], 6) == round(60 / 62, 6)
    assert len(d["per_pair"]) == 2 and "warm_end_to_end_speedup" in d["per_pair"][0]
    assert (tmp_path / "rl_step_e2e.png").stat().st_size > 1000
