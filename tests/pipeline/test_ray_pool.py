"""The main job on a real Ray cluster (one per pytest run): rollout actors and the trainer are Ray actors."""

import json

from services.pipeline.cli import main


def test_train_on_ray(tmp_path, tiny_policy_dir, ray_cluster):
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--run-dir",
            str(run),
            f"model.path={tiny_policy_dir}",
            "trainer.steps=2",
            "trainer.prompts_per_step=4",
            "trainer.group_size=2",
            "rollout.max_new_tokens=12",
            "rollout.num_actors=2",
            "ray.use_ray=true",
        ]
    )
    assert rc == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and sorted(w["worker"] for w in rows[0]["workers"]) == [0, 1]
    assert sum(w["requests"] for w in rows[0]["workers"]) == 8
    assert ray_cluster.is_initialized()  # the driver leaves a cluster it did not start running
    assert (run / "summary.json").exists()
