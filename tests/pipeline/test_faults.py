"""Faults in a running job: kill a rollout actor in the middle of a rollout (its unfinished requests are
re-dispatched, the step ends with exactly G responses for every prompt, none lost, none doubled; later steps run
on the survivors); kill the coordinator actor in the middle of a rollout (a fresh one is rebuilt from the
workers' own reports and the step completes); SIGKILL the policy trainer's process in the middle of an update
(a fresh trainer is restored from the newest checkpoint plus the updates since, the update is redone and the
policy version never goes back); SIGKILL the tuner's process during a rollout (the rollout goes on, the next
phase boundary restarts the tuner from its checkpoint and the run goes on tuning)."""

import os
import signal
import threading
import time

from services.common.config import load_config
from services.pipeline.driver import RLDriver

B, G = 8, 8


def _config(tiny_policy_dir, *extra):
    return load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            "trainer.steps=2",
            f"trainer.prompts_per_step={B}",
            f"trainer.group_size={G}",
            "rollout.max_new_tokens=200",
            "rollout.max_batch_size=4",
            "rollout.num_actors=2",
            "ray.use_ray=true",
            "spot.enabled=false",
            "tuner.enabled=false",
            "rollout.speculative.speedup_sample_prompts=0",
            *extra,
        ],
    )


def _kill_after_submit(pool, member: int, method: str, delay_s: float, kill) -> list[float]:
    """Kill ``pool.members[member]`` ``delay_s`` after its first ``method`` call is submitted (so the kill
    lands while that call runs, whatever the machine's speed), or, with ``delay_s=None``, just before it is
    submitted (the call finds the actor dead); returns a list that gets the kill's time."""
    submit, killed = pool.submit, []

    def spy(i, m, *args):
        fire = None
        if i == member and m == method and not killed:
            victim = pool.members[i]
            killed.append(0.0)

            def fire():
                killed[0] = time.monotonic()
                kill(victim)

            if delay_s is None:
                fire()
        fut = submit(i, m, *args)
        if fire is not None and delay_s is not None:
            threading.Timer(delay_s, fire).start()
        return fut

    pool.submit = spy
    return killed


def test_kill_rollout_actor_mid_rollout(tmp_path, tiny_policy_dir, ray_cluster):
    driver = RLDriver(_config(tiny_policy_dir), run_dir=tmp_path / "run")
    driver._start_services()
    try:
        killed = _kill_after_submit(driver.plane.rollout, 1, "rollout", 0.05, ray_cluster.kill)
        row = driver.step(1)
        assert killed and killed[0] > 0
        # the victim's shard came back from the survivor: the kill landed before that shard returned
        assert {w["worker"] for w in row["workers"]} == {0}, (
            "the victim returned its shard: no fault was shown"
        )
        assert driver.plane.coordinator.states()["1"] == "FAILED"
        assert driver.plane.worker_ids == [0] and len(driver.plane.rollout) == 1
        assert sum(w["requests"] for w in row["workers"]) == B * G
        assert row["tokens_generated"] == sum(w["tokens"] for w in row["workers"])
        row2 = driver.step(2)  # the next step runs on the survivor alone
        assert [w["worker"] for w in row2["workers"]] == [0] and row2["workers"][0]["requests"] == B * G
    finally:
        driver._stop_services()


def test_kill_rollout_actor_during_weight_sync(tmp_path, tiny_policy_dir, ray_cluster):
    """A rollout actor dies while the new policy weights load: it is marked FAILED and dropped, the step
    ends, and the next step runs on the survivor with every response."""
    driver = RLDriver(_config(tiny_policy_dir), run_dir=tmp_path / "run")
    driver._start_services()
    try:
        killed = _kill_after_submit(driver.plane.rollout, 1, "load_weights", None, ray_cluster.kill)
        row = driver.step(1)
        assert killed and killed[0] > 0
        assert sorted(w["worker"] for w in row["workers"]) == [0, 1]  # the rollout itself ran on both
        assert driver.plane.coordinator.states()["1"] == "FAILED"
        assert driver.plane.worker_ids == [0] and len(driver.plane.rollout) == 1
        row2 = driver.step(2)
        assert [w["worker"] for w in row2["workers"]] == [0] and row2["workers"][0]["requests"] == B * G
        assert row2["policy_version"] == row["policy_version"] + 1
    finally:
        driver._stop_services()


def test_kill_coordinator_mid_rollout(tmp_path, tiny_policy_dir, ray_cluster):
    """The coordinator actor dies while both rollout actors decode: the driver's next call finds it gone,
    starts a fresh one, every rollout actor re-registers in its own state (ROLLOUT while still decoding, IDLE
    once done), and the step ends normally with every response."""
    driver = RLDriver(_config(tiny_policy_dir, "tuner.enabled=true"), run_dir=tmp_path / "run")
    driver._start_services()
    try:
        first = driver.plane.coordinator_address
        victim = driver.plane.coordinator_pool.members[0]
        killed = _kill_after_submit(
            driver.plane.rollout, 0, "rollout", 0.05, lambda _: ray_cluster.kill(victim)
        )
        row = driver.step(1)
        assert killed and killed[0] > 0
        assert driver.plane.coordinator_restarts == 1 and driver.plane.coordinator_address != first
        assert sum(w["requests"] for w in row["workers"]) == B * G
        assert driver.plane.coordinator.states() == {"0": "IDLE", "1": "IDLE"}
        assert "tuner" in row  # the rest of the step (tables over gRPC) ran on
        row2 = driver.step(2)
        assert sum(w["requests"] for w in row2["workers"]) == B * G
        assert driver.plane.coordinator_restarts == 1
    finally:
        driver._stop_services()


def test_groups_complete_after_redispatch_unit():
    """Shards map back to prompts: every prompt keeps exactly G responses (checked on the assignment itself)."""
    from services.pipeline.scheduling import assign_groups

    groups = [(f"p{i}", float(10 * i)) for i in range(7)]
    shards = assign_groups(groups, 3)
    flat = [pid for shard in shards for pid in shard]
    assert sorted(flat) == sorted(pid for pid, _ in groups) and len(set(flat)) == len(flat)


def test_kill_spot_trainer_replica(tmp_path, tiny_policy_dir, ray_cluster):
    """A spot-trainer replica that trained is killed between steps: at the next phase boundary it is started
    again on its checkpoint folder (resuming its training step), the drafter version does not go back, and
    the job goes on training in bubbles."""
    driver = RLDriver(
        _config(
            tiny_policy_dir,
            "spot.enabled=true",
            "spot.min_fresh_samples=16",
            "spot.batch_size=8",
            "rollout.max_new_tokens=48",
            "trainer.prompts_per_step=4",
            "trainer.group_size=4",
        ),
        run_dir=tmp_path / "run",
    )
    driver._start_services()
    plane = driver.plane
    try:
        trained = []
        for step in (1, 2, 3):
            row = driver.step(step)
            trained = [w["worker"] for w in row["workers"] if w["trained_seconds"] > 0]
            if trained:
                break
        assert trained, "no bubble was trained in 3 steps: the test proved nothing"
        replica = trained[0] % len(plane.spot)
        before = plane.spot.call(replica, "stats")
        version = plane.drafter_version
        assert before["step"] > 0 and version >= 1
        ray_cluster.kill(plane.spot.members[replica])
        row = driver.step(step + 1)
        assert plane.spot_restarts == 1 and row["spot_restarts"] == 1
        after = plane.spot.call(replica, "stats")
        assert after["pid"] != before["pid"]
        assert 0 < after["resumed_step"] <= before["step"]  # its newest checkpoint (written at preemption)
        assert row["drafter_version"] >= version
        assert sum(w["requests"] for w in row["workers"]) == 4 * 4
    finally:
        driver._stop_services()


def test_sigkill_policy_trainer_mid_update(tmp_path, tiny_policy_dir, ray_cluster):
    driver = RLDriver(
        _config(tiny_policy_dir, "trainer.steps=3", "rollout.max_new_tokens=96"), run_dir=tmp_path / "run"
    )
    driver._start_services()
    try:
        row1 = driver.step(1)
        driver.rows.append(row1)
        driver._save_checkpoint(1)
        pid = driver.trainer.call(0, "pid")
        call_many, killed = driver.trainer.call_many, []

        def spy(calls):
            if any(m == "train_step" for _, m, _ in calls) and not killed:
                killed.append(pid)
                threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
            return call_many(calls)

        driver.trainer.call_many = spy
        row2 = driver.step(2)
        assert killed and driver.trainer.call(0, "pid") != pid  # a new process trains now
        assert row2["trainer_restarts"] == 1
        assert [row1["policy_version"], row2["policy_version"]] == [1, 2]
        assert sum(w["requests"] for w in row2["workers"]) == B * G
        row3 = driver.step(3)
        assert row3["policy_version"] == 3 and row3["trainer_restarts"] == 1
    finally:
        driver._stop_services()


def test_sigkill_tuner_mid_rollout(tmp_path, tiny_policy_dir, ray_cluster):
    driver = RLDriver(
        _config(tiny_policy_dir, "tuner.enabled=true", "rollout.max_new_tokens=96"), run_dir=tmp_path / "run"
    )
    driver._start_services()
    try:
        row1 = driver.step(1)
        merged = driver.plane.tuner.call(0, "ping")
        assert merged > 0  # step 1's observations are in its checkpoint
        pid = driver.plane.tuner.call(0, "pid")
        killed = _kill_after_submit(
            driver.plane.rollout, 0, "rollout", 0.05, lambda _: os.kill(pid, signal.SIGKILL)
        )
        row2 = driver.step(2)
        assert killed and killed[0] > 0
        assert row2["tuner"]["tuner_restarts"] == 1 and driver.plane.tuner.call(0, "pid") != pid
        assert driver.plane.tuner.call(0, "ping") >= merged  # resumed its checkpoint, not a cold table
        assert row2["tuner"]["table_version"] >= row1["tuner"]["table_version"]
        assert sum(w["requests"] for w in row2["workers"]) == B * G
        assert row2["policy_version"] == row1["policy_version"] + 1
    finally:
        driver._stop_services()
