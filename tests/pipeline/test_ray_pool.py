"""The main job on a real Ray cluster (one per pytest run): rollout actors and the trainer are Ray actors."""

import json


def test_train_on_ray(train_tiny, ray_cluster):
    run = train_tiny("rollout.num_actors=2", "ray.use_ray=true", prompts=4)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and sorted(w["worker"] for w in rows[0]["workers"]) == [0, 1]
    assert sum(w["requests"] for w in rows[0]["workers"]) == 8
    assert ray_cluster.is_initialized()  # the driver leaves a cluster it did not start running
    assert (run / "summary.json").exists()
