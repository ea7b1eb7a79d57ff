"""A second run starts its tuner from the first run's checkpoint (``tuner.init_state``): its tuner state holds
both runs' off / suffix / n-gram observations, and summary.json names the file it started from."""

import json

from services.pipeline.cli import main

ARGS = [
    "trainer.steps=2",
    "trainer.prompts_per_step=3",
    "trainer.group_size=2",
    "rollout.max_new_tokens=12",
    "ray.use_ray=false",
    "spot.enabled=false",
    "rollout.speculative.speedup_sample_prompts=0",
]


def _totals(state_file) -> dict[str, int]:
    """Observations per arm over all buckets (the ``n`` counters, which a window's turnover does not reset)."""
    out: dict[str, int] = {}
    for b in json.loads(state_file.read_text())["bandit"]["buckets"]:
        for name, st in b["arms"].items():
            out[name] = out.get(name, 0) + int(st.get("n", 0))
    return out


def test_second_run_starts_from_the_first_runs_tuner_state(tmp_path, tiny_policy_dir):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", "--run-dir", str(first), f"model.path={tiny_policy_dir}", *ARGS]) == 0
    state = first / "checkpoints" / "tuner_state.json"
    before = _totals(state)
    assert before.get("off", 0) > 0
    rc = main(
        [
            "train",
            "--run-dir",
            str(second),
            f"model.path={tiny_policy_dir}",
            *ARGS,
            f"tuner.init_state={state}",
        ]
    )
    assert rc == 0
    after = _totals(second / "checkpoints" / "tuner_state.json")
    rows = [json.loads(x)["tuner"] for x in (second / "metrics.jsonl").read_text().splitlines()]
    records = sum(r["observations"] for r in rows)  # the second run's records to the tuner
    own = sum(sum(r["choices"].values()) for r in rows)  # the second run's decode steps
    grown = sum(after.values()) - sum(before.values())
    # the first run's evidence plus the second's: each record counts its step and the leased steps it carries
    # (StrategySelector), so every decode step is counted
    assert 0 < records <= grown <= own
    assert after["off"] > before["off"]
    summary = json.loads((second / "summary.json").read_text())
    assert summary["tuner"]["init_state"] == str(state)
    assert json.loads((first / "summary.json").read_text())["tuner"]["init_state"] is None
