"""Kill the spot trainer service and start it again on the same checkpoint folder: it resumes from its newest
checkpoint (same training step) and the published drafter version never goes back."""

import time

import torch

from services.spot_trainer.buffer import Frame
from services.spot_trainer.service import SpotTrainerService
from services.spot_trainer.stream import HiddenStateSender


def _feed(svc: SpotTrainerService, n_frames: int = 6, length: int = 24) -> None:
    hidden = svc.target.config.hidden_size
    sender = HiddenStateSender(svc.address())
    g = torch.Generator().manual_seed(0)
    for i in range(n_frames):
        sender.send(
            Frame(
                0,
                f"r{i}",
                torch.arange(length),
                torch.randn(length, 1, hidden, generator=g),
                torch.randint(0, svc.target.config.vocab_size, (length,), generator=g),
            )
        )
    deadline = time.monotonic() + 10
    while svc.num_fresh() < n_frames * length and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.num_fresh() == n_frames * length


def test_restart_resumes_and_versions_only_go_up(tmp_path, tiny_policy_dir):
    ckpt = tmp_path / "spot"
    svc = SpotTrainerService(
        str(tiny_policy_dir), str(ckpt), batch_size=4, seq_len=4, min_samples=8, checkpoint_every=3
    )
    _feed(svc)
    svc.open_phase()
    out = svc.train(0, max_steps=5)
    assert out["steps"] == 5
    v1, head1 = svc.publish()
    svc.spot.checkpoint(async_=False)
    step_before = svc.spot.step
    svc.close()  # "killed": a new process starts from the folder alone

    again = SpotTrainerService(str(tiny_policy_dir), str(ckpt), batch_size=4, seq_len=4, min_samples=8)
    assert again.resumed_step == step_before == 5
    for k, v in again.head.state_dict().items():
        assert torch.equal(v, head1[k]), k  # the resumed head is the one that was trained
    v2, _ = again.publish()
    assert v2 == v1 + 1
    again.close()
