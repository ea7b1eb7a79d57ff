"""Spot trainer: stops between steps, deadline, checkpoint + resume across a restart, half-written checkpoints
ignored, published versions monotonic, phase-boundary loading, parameter averaging of 2 replicas."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

import services.spot_trainer.trainer as trainer_mod
from services.spot_trainer.buffer import Frame, HiddenStateBuffer
from services.spot_trainer.trainer import (
    DrafterLoader,
    SpotTrainer,
    average_parameters,
    latest_checkpoint,
    latest_published,
    load_published,
)

# DCP warns that it saves in a single process: our intent (trainer.py filters it process-wide at import,
# but pytest resets the filters around each test).
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

D = 8


class TinyDrafter:
    """Stand-in for the learned drafter: predicts the next hidden state from the current one (seq_len=2
    windows), with Adam; ``state_dict`` holds model and optimizer (int keys, tuples, 0-dim tensors)."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.calls = 0

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict:
        self.calls += 1
        x, y = batch["hidden"][:, 0].float(), batch["hidden"][:, 1].float()
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"loss": loss.item()}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optim"])


def filled_buffer(n_frames: int = 8, rows: int = 16) -> HiddenStateBuffer:
    buf = HiddenStateBuffer(capacity_tokens=10_000, keep_versions=2)
    g = torch.Generator().manual_seed(0)
    for i in range(n_frames):
        buf.add(Frame(1, f"r{i}", torch.arange(rows), torch.randn(rows, D, generator=g), torch.arange(rows)))
    return buf


def make_trainer(tmp_path, seed=0, **kw) -> tuple[SpotTrainer, TinyDrafter]:
    d = TinyDrafter(seed)
    kw = dict(dict(checkpoint_every=2, batch_size=4, seq_len=2, seed=1), **kw)
    buf = kw.pop("buffer") if "buffer" in kw else filled_buffer()
    t = SpotTrainer(d.train_step, d, buf, tmp_path / "ckpt", **kw)
    return t, d


def states_equal(a: dict, b: dict) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


# ---------------------------------------------------------------------- the granted loop
def test_stops_between_steps_on_should_stop(tmp_path):
    t, d = make_trainer(tmp_path, checkpoint_every=100)
    checks = []

    def should_stop():
        checks.append(d.calls)  # how many steps had completed when asked
        return len(checks) > 3

    out = t.run_granted(should_stop)
    assert out["steps"] == 3 and out["preempted"] and out["stop_reason"] == "preempted"
    assert checks == [0, 1, 2, 3]  # asked before every step, never inside one
    assert "loss" in out["metrics"] and out["step"] == 3
    t.wait()
    assert latest_checkpoint(t.ckpt_dir)[0] == 3  # checkpoint on preemption
    out = t.run_granted(lambda: False, max_steps=2)
    assert out == dict(out, steps=2, preempted=False, stop_reason="max_steps", step=5)
    t.close()


def test_deadline_and_no_data(tmp_path):
    clock = [0.0]
    t, d = make_trainer(tmp_path, clock=lambda: clock[0], checkpoint_every=100)
    inner = t.step_fn

    def slow_step(batch):
        clock[0] += 1.0  # each step takes 1 s of (fake) time
        return inner(batch)

    t.step_fn = slow_step
    out = t.run_granted(lambda: False, deadline=3.5)
    # after 3 steps (t=3) one more estimated 1-second step would pass the deadline
    assert out["steps"] == 3 and out["preempted"] and out["stop_reason"] == "deadline"
    t.close()
    empty, _ = make_trainer(tmp_path / "e", buffer=HiddenStateBuffer(100))
    assert empty.run_granted(lambda: False, max_steps=5)["stop_reason"] == "no_data"
    empty.close()


# ---------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("mode", ["async", "sync", "thread_fallback"])
def test_checkpoint_resume_after_restart(tmp_path, monkeypatch, mode):
    if mode == "thread_fallback":
        monkeypatch.setattr(trainer_mod, "_HAS_ASYNC", False)
    t, d = make_trainer(tmp_path, checkpoint_every=100)
    t.run_granted(lambda: False, max_steps=5)
    t.checkpoint(async_=(mode != "sync"))
    saved, rng_state = copy.deepcopy(d.state_dict()), copy.deepcopy(t.rng.bit_generator.state)
    t.run_granted(lambda: False, max_steps=2)  # the uninterrupted run goes on (async save in flight)
    t.close()
    expected = d.state_dict()

    # "restart": new objects, different initial weights, empty optimizer state
    t2, d2 = make_trainer(tmp_path, seed=123, checkpoint_every=100)
    assert not states_equal(d2.state_dict()["model"], saved["model"])
    assert t2.resume() == 5
    assert t2.step == 5 and states_equal(d2.state_dict(), saved)
    assert t2.rng.bit_generator.state == rng_state
    assert isinstance(d2.opt.state_dict()["param_groups"][0]["betas"], tuple)
    # training continues from there exactly as the uninterrupted run did
    t2.run_granted(lambda: False, max_steps=2)
    assert t2.step == 7 and states_equal(d2.state_dict(), expected)
    t2.close()


def test_half_written_checkpoint_is_ignored_and_old_ones_pruned(tmp_path):
    t, d = make_trainer(tmp_path, checkpoint_every=1, keep_checkpoints=2)
    t.run_granted(lambda: False, max_steps=4)
    t.wait()
    steps = sorted(p.name for p in t.ckpt_dir.iterdir() if p.name.startswith("step_"))
    assert steps == ["step_000000003", "step_000000004"]
    # a crash in the middle of writing step 9: files present, no marker
    broken = t.ckpt_dir / "step_000000009"
    broken.mkdir()
    (broken / "state.json").write_text("{truncated")
    t.close()
    t2, _ = make_trainer(tmp_path, seed=5)
    assert t2.resume() == 4
    t2.close()


# ---------------------------------------------------------------------- publishing
def test_published_version_monotonic_across_restart(tmp_path):
    t, d = make_trainer(tmp_path, checkpoint_every=100)
    t.run_granted(lambda: False, max_steps=1)
    t.checkpoint(async_=False)  # records version 0
    assert t.publish() == 1
    t.run_granted(lambda: False, max_steps=1)
    assert t.publish() == 2
    v, path = latest_published(t.publish_dir)
    assert v == 2 and states_equal(load_published(path), d.state_dict())
    assert json.loads((path / "COMPLETE").read_text())["policy_version"] == 1
    t.close()

    t2, _ = make_trainer(tmp_path, seed=9, checkpoint_every=100)  # restarted, before resume
    assert t2.version == 2
    assert t2.resume() == 1 and t2.version == 2  # the checkpoint says 0: the version never goes back
    assert t2.publish() == 3
    t2.close()
    assert latest_published(tmp_path / "nothing") == (0, None)


def test_drafter_loader_loads_only_at_phase_boundaries(tmp_path):
    t, d = make_trainer(tmp_path, publish_state=lambda: d.model.state_dict())
    rollout_side = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D))
    loader = DrafterLoader(t.publish_dir, rollout_side.load_state_dict)
    assert loader.at_phase_boundary() == 0  # nothing published yet
    t.run_granted(lambda: False, max_steps=2)
    t.publish()
    before = [p.clone() for p in rollout_side.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, rollout_side.parameters()))  # no load mid-phase
    assert loader.at_phase_boundary() == 1
    assert states_equal(rollout_side.state_dict(), d.model.state_dict())
    assert loader.at_phase_boundary() == 1
    t.close()


# ---------------------------------------------------------------------- data parallel
def test_parameter_averaging_of_two_replicas():
    buf = filled_buffer()
    reps = [TinyDrafter(0), TinyDrafter(0)]
    rng = np.random.default_rng(0)
    for r in reps:  # same start, different samples
        for _ in range(3):
            r.train_step(buf.sample(4, rng, seq_len=2))
    m0, m1 = reps[0].model, reps[1].model
    assert not all(torch.equal(a, b) for a, b in zip(m0.parameters(), m1.parameters()))
    expect = {k: (v + m1.state_dict()[k]) / 2 for k, v in m0.state_dict().items()}
    average_parameters([m0, m1])
    for m in (m0, m1):
        for k, v in m.state_dict().items():
            assert torch.allclose(v, expect[k], atol=1e-7)
    # weighted (e.g. by steps done); integer tensors are taken from the first replica
    a = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(7)}
    mean = trainer_mod.average_state_dicts([a, b], weights=[3, 1])
    assert torch.equal(mean["w"], torch.tensor([1.0, 5.0])) and int(mean["n"]) == 3
    # replicas keep training after averaging (a full optimizer+model state also averages)
    average_parameters(reps)
    reps[0].train_step(buf.sample(4, rng, seq_len=2))
