"""Fixtures of the spot-trainer service tests: replicas on the tiny policy, fed with random hidden states."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from services.spot_trainer.buffer import Frame
from services.spot_trainer.service import SpotTrainerService
from services.spot_trainer.stream import HiddenStateSender

FRAME_LEN = 24


def feed(
    services: SpotTrainerService | list[SpotTrainerService], n_frames: int = 6, seed: int = 0
) -> HiddenStateSender:
    """Push ``n_frames`` random frames (policy version 0) to the replicas through one sender (round-robin
    across them) and wait until every frame is in a buffer. Returns the (still open) sender."""
    svcs = services if isinstance(services, list) else [services]
    cfg = svcs[0].target.config
    sender = HiddenStateSender([s.address() for s in svcs])
    g = torch.Generator().manual_seed(seed)
    for i in range(n_frames):
        sender.send(
            Frame(
                0,
                f"r{seed}-{i}",
                torch.arange(FRAME_LEN),
                torch.randn(FRAME_LEN, 1, cfg.hidden_size, generator=g),
                torch.randint(0, cfg.vocab_size, (FRAME_LEN,), generator=g),
            )
        )
    wait_for(lambda: sum(s.num_fresh() for s in svcs) >= n_frames * FRAME_LEN)
    assert sum(s.num_fresh() for s in svcs) == n_frames * FRAME_LEN
    return sender


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``cond`` until true or ``timeout`` seconds (a guard against hangs, not a timed assertion)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def make_service(tmp_path, tiny_policy_dir):
    """``make_service(replica=0, ckpt=None, **kw)``: a replica with tiny batches on ``tmp_path/spot`` (or
    ``ckpt``); every replica made is closed at teardown."""
    made: list[SpotTrainerService] = []

    def make(replica: int = 0, ckpt=None, **kw) -> SpotTrainerService:
        kw = dict(dict(batch_size=4, seq_len=4, min_samples=8, checkpoint_every=1000), **kw)
        svc = SpotTrainerService(str(tiny_policy_dir), str(ckpt or tmp_path / "spot"), replica=replica, **kw)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()
