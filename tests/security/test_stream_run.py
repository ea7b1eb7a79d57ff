"""(c) in a real run: between its first and second step another process pushes junk and hostile frames at every
spot-trainer replica's hidden-state endpoint; each replica drops and counts them, its receiver thread lives on,
the rollout actors' frames (with the run's MAC) keep arriving, the drafter keeps training, and the run
completes (in-process services, as ``tests/pipeline/test_bubbles_run.py`` runs them)."""

from __future__ import annotations

import json

from services.common.config import load_config
from services.pipeline.driver import RLDriver
from tests.security.test_stream import _attack
from tests.spot_trainer.conftest import wait_for

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


def test_hostile_frames_in_a_run_are_dropped_and_drafter_training_goes_on(
    tmp_path, tiny_policy_dir, monkeypatch
):
    monkeypatch.delenv("TAILSPEC_GRPC_TOKEN", raising=False)
    run_dir = tmp_path / "run"
    cfg = load_config(None, [f"model.path={tiny_policy_dir}", *ARGS])
    driver = RLDriver(cfg, run_dir=run_dir)
    at_attack: dict = {}
    step = driver.step

    def step_then_attack(i: int) -> dict:
        row = step(i)
        if i == 1:
            replicas = driver.plane.spot.members
            at_attack["received"] = [r.receiver.received for r in replicas]
            at_attack["sent"] = [
                _attack(r.address(), None) + _attack(r.address(), "a-wrong-key") for r in replicas
            ]
            for r, before, sent in zip(replicas, at_attack["received"], at_attack["sent"]):
                assert wait_for(lambda r=r, n=before + sent: r.receiver.received >= n, timeout=120)
                assert r.receiver._thread.is_alive()
            at_attack["added"] = [r.buffer.added for r in replicas]
            at_attack["steps"] = [r.spot.step for r in replicas]
        return row

    driver.step = step_then_attack
    summary = driver.run()
    replicas = driver.plane.spot.members  # closed, but their counters stay readable

    assert summary["steps"] == 3
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r, sent, received in zip(replicas, at_attack["sent"], at_attack["received"]):
        assert sent == 4 + 8  # 4 junk / MAC-less messages, then those and 4 frames under a wrong key
        assert r.receiver.received >= received + sent
        assert r.receiver.dropped["unauthenticated"] == sent
        assert r.receiver.dropped["malformed"] == r.receiver.dropped["out_of_range"] == 0
        assert r.buffer.current_version is not None and r.buffer.current_version <= 3
    # the run's own frames kept arriving and training went on after the attack
    assert sum(r.buffer.added for r in replicas) > sum(at_attack["added"])
    assert sum(r.spot.step for r in replicas) > sum(at_attack["steps"])
    assert summary["drafter_version"] >= 1
