"""Kill a spot-trainer replica and start it again on the same checkpoint folder: it resumes from its newest
checkpoint (same training step, same head) and the published drafter version never goes back."""

import pytest
import torch

from services.spot_trainer.trainer import load_published
from tests.spot_trainer.conftest import feed, wait_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _train_a_little(svc, gid: str, steps: int = 3) -> dict:
    assert svc.grant({"grant_id": gid, "worker_id": "0"})["accepted"]
    assert wait_for(lambda: svc.spot.step >= steps)
    out = svc.preempt(gid)
    assert out["released"] and out["steps_in_grant"] >= 1
    return out


def test_restart_resumes_and_versions_only_go_up(tmp_path, make_service):
    ckpt = tmp_path / "spot"
    svc = make_service(ckpt=ckpt)
    feed(svc).close()
    _train_a_little(svc, "g1")  # preemption checkpoints asynchronously
    v1, path1 = svc.publish()
    head1 = load_published(path1)
    step_before = svc.spot.step
    svc.close()  # "killed": a new process starts from the folder alone (close waits for the checkpoint)
    assert (ckpt / "replica_0").is_dir() and (ckpt / "published").is_dir()

    again = make_service(ckpt=ckpt)
    assert again.resumed_step == step_before == again.stats()["step"]
    for k, v in again.head.state_dict().items():
        assert torch.equal(v, head1[k]), k  # the resumed head is the one that was trained
    assert again.drafter_version == v1
    assert again.stats()["published_path"].endswith(f"published/v{v1:09d}")
    v2, _ = again.publish()
    assert v2 == v1 + 1


def test_replicas_checkpoint_apart_and_only_the_leader_publishes(tmp_path, make_service):
    ckpt = tmp_path / "spot"
    leader, other = make_service(0, ckpt), make_service(1, ckpt)
    feed([leader, other], n_frames=8).close()
    _train_a_little(other, "g-other")
    v, _ = leader.publish()
    with pytest.raises(RuntimeError, match="leader"):
        other.publish()
    assert other.status()["drafter_version"] == v  # the pool's newest version, read from the shared folder
    step_other = other.spot.step
    other.close()
    again = make_service(1, ckpt)
    assert again.resumed_step == step_other  # from ckpt/replica_1
    assert leader.spot.step == 0 and (ckpt / "replica_1").is_dir()
