"""The main job trains the learned drafter in rollout bubbles (in-process services): the coordinator grants an
idle worker's bubble to the spot trainer, the drafter version goes up, and bubble accounting lands in
metrics.jsonl / summary.json with a worker-timeline plot. With spot.enabled=false nothing is trained."""

import json

from services.pipeline.cli import main

ARGS = [
    "trainer.steps=3",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "rollout.max_new_tokens=48",
    "rollout.num_actors=2",
    "ray.use_ray=false",
    "spot.min_fresh_samples=16",
    "spot.batch_size=8",
    "rollout.speculative.speedup_sample_prompts=0",
]


def _run(tmp_path, policy, *extra):
    run = tmp_path / "run"
    # uneven shards (one prompt for worker 1, three for worker 0) so that one worker idles
    assert main(["train", "--run-dir", str(run), f"model.path={policy}", *ARGS, *extra]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return run, rows, json.loads((run / "summary.json").read_text())


def test_bubbles_are_trained_and_accounted(tmp_path, tiny_policy_dir):
    run, rows, summary = _run(tmp_path, tiny_policy_dir)
    for r in rows:
        assert {"bubble_seconds", "bubble_trained_seconds", "bubble_utilization", "drafter_version"} <= set(r)
        assert 0.0 <= r["bubble_trained_seconds"] <= r["bubble_seconds"] + 1e-9
        idle = sum(w["idle_seconds"] for w in r["workers"])
        assert abs(idle - r["bubble_seconds"]) < 0.05  # same idle time, measured by the driver and the ledger
    assert summary["spot_training"] is True
    assert summary["spot_replicas"] == 2  # one replica per rollout actor, averaged before publish
    assert summary["bubble_trained_seconds_total"] > 0, "no bubble was ever used for training"
    assert summary["drafter_version"] >= 1
    versions = [r["drafter_version"] for r in rows]
    assert versions == sorted(versions)  # published versions never go back
    assert (
        summary["bubble_utilization"]
        == summary["bubble_trained_seconds_total"] / summary["bubble_seconds_total"]
    )
    assert (run / "plots" / "worker_timeline.png").stat().st_size > 1000
    assert any((run / "checkpoints" / "spot_trainer").iterdir())


def test_spot_training_off(tmp_path, tiny_policy_dir):
    _, rows, summary = _run(tmp_path, tiny_policy_dir, "spot.enabled=false")
    assert summary["spot_training"] is False
    assert summary["bubble_trained_seconds_total"] == 0 and summary["drafter_version"] == 0
    assert summary["bubble_seconds_total"] >= 0
