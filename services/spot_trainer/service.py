"""SpotTrainerService: trains the learned (EAGLE) drafter in rollout bubbles. Plain Python; the driver runs it as
a threaded Ray actor (``max_concurrency`` > 1, so ``preempt`` reaches it while ``train`` runs) or in-process.

Data path: rollout actors stream ``Frame(policy_version, request_id, positions, hidden, tokens)`` over ZeroMQ
(PUSH) to this service's ``HiddenStateReceiver`` (PULL, a background thread) into a bounded
``HiddenStateBuffer`` (drops the oldest when full; keeps the last K policy versions). ``train(worker)`` runs
``SpotTrainer.run_granted`` (one ``EagleTrainer.train_step`` per buffer sample of ``seq_len`` consecutive
positions) until ``preempt()`` or a deadline; checkpoints go asynchronously through torch.distributed.checkpoint;
``publish()`` bumps the drafter version and returns the draft head's weights for the rollout actors, which
install them at the next phase boundary.

Several granted workers share this one trainer (their bubbles are the CPU time it runs on); the data-parallel
path of ``services/spot_trainer/trainer.py`` (parameter averaging) is for several trainer replicas.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle import (
    EagleConfig,
    EagleDraftModel,
    EagleTrainer,
    default_fuse_layers,
)
from services.spot_trainer.buffer import HiddenStateBuffer
from services.spot_trainer.stream import HiddenStateReceiver
from services.spot_trainer.trainer import SpotTrainer


class _TrainerState:
    """state_dict/load_state_dict over the draft head and its optimizer (what checkpoints hold)."""

    def __init__(self, trainer: EagleTrainer):
        self.t = trainer

    def state_dict(self) -> dict:
        return {
            "model": self.t.model.state_dict(),
            "optimizer": self.t.optimizer.state_dict(),
            "steps": self.t.steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.t.model.load_state_dict(sd["model"])
        self.t.optimizer.load_state_dict(sd["optimizer"])
        self.t.steps = int(sd.get("steps", 0))


class SpotTrainerService:
    """Args:
    model_path: HF folder of the policy (the draft head shares its embedding and LM head).
    ckpt_dir: checkpoints and published drafters live here; an existing checkpoint is resumed.
    eagle3 / seed: draft head shape and init (identical to the rollout actors' initial head).
    capacity_tokens, keep_versions, batch_size, seq_len, lr, checkpoint_every, min_samples: training knobs.
    threads: torch threads for training.
    """

    def __init__(
        self,
        model_path: str,
        ckpt_dir: str,
        eagle3: bool = False,
        seed: int = 0,
        capacity_tokens: int = 200_000,
        keep_versions: int = 2,
        batch_size: int = 32,
        seq_len: int = 4,
        lr: float = 1e-3,
        checkpoint_every: int = 50,
        min_samples: int = 256,
        threads: int = 1,
        address: str = "tcp://127.0.0.1:*",
    ):
        torch.set_num_threads(max(1, threads))
        self.target = Transformer.from_pretrained(model_path)
        for p in self.target.parameters():
            p.requires_grad_(False)
        fuse = default_fuse_layers(self.target.config.num_hidden_layers) if eagle3 else None
        self.head = EagleDraftModel(self.target.config, EagleConfig(fuse_layers=fuse, seed=seed))
        self.eagle = EagleTrainer(self.head, self.target, lr=lr, seed=seed)
        self.buffer = HiddenStateBuffer(capacity_tokens, keep_versions=keep_versions)
        self.receiver = HiddenStateReceiver(address, self.buffer)
        self.receiver.start()
        self.spot = SpotTrainer(
            self._step,
            _TrainerState(self.eagle),
            self.buffer,
            ckpt_dir,
            checkpoint_every=checkpoint_every,
            batch_size=batch_size,
            seq_len=seq_len,
            min_samples=min_samples,
            publish_state=self.head.state_dict,
            seed=seed,
        )
        self.resumed_step = self.spot.resume()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one grant trains at a time
        self.last_metrics: dict = {}

    # ------------------------------------------------------------------ plumbing
    def ping(self) -> int:
        return self.spot.step

    def address(self) -> str:
        """The ZeroMQ PULL endpoint rollout actors push frames to."""
        return self.receiver.address

    def _step(self, batch: dict) -> dict:
        hidden = batch["hidden"]  # [B, L, k, H] (k = fused layers)
        feats = hidden[:, :, 0] if hidden.dim() == 4 and hidden.shape[2] == 1 else hidden
        m = self.eagle.train_step(
            {
                "tokens": batch["tokens"],
                "features": feats,
                "mask": torch.ones(batch["tokens"].shape, dtype=torch.bool),
            }
        )
        self.last_metrics = m
        return m

    def update_policy(self, state: dict[str, torch.Tensor], version: int) -> int:
        """New policy weights (the head reads the target's embedding and LM head); old data ages out."""
        with torch.no_grad():
            self.target.load_state_dict(state, strict=False)
        self.buffer.age_out(version)
        return version

    # ------------------------------------------------------------------ grants
    def num_fresh(self) -> int:
        return self.buffer.num_fresh()

    def train(self, worker_id: int, max_seconds: float | None = None, max_steps: int | None = None) -> dict:
        """Train while granted (until ``preempt()``, ``max_seconds`` or no data); returns the grant's stats."""
        with self._lock:  # grants of several workers train one after another until the phase's preempt
            deadline = time.monotonic() + max_seconds if max_seconds is not None else None
            t0 = time.time()
            out = self.spot.run_granted(self._stop.is_set, deadline=deadline, max_steps=max_steps)
            out.update(
                worker=worker_id,
                started_at=t0,
                finished_at=time.time(),
                top1=self.last_metrics.get("top1"),
                loss=self.last_metrics.get("loss"),
            )
            return out

    def open_phase(self) -> None:
        """A rollout phase begins: grants may train until the next ``preempt``."""
        self._stop.clear()

    def preempt(self) -> bool:
        """Stop training between steps (the in-flight step finishes)."""
        self._stop.set()
        return True

    def publish(self) -> tuple[int, dict[str, torch.Tensor]]:
        """A new drafter version: (version, draft-head state dict)."""
        version = self.spot.publish()
        return version, {k: v.detach().clone() for k, v in self.head.state_dict().items()}

    def stats(self) -> dict[str, Any]:
        return {
            "step": self.spot.step,
            "version": self.spot.version,
            "buffer": self.buffer.stats(),
            "resumed_step": self.resumed_step,
            "pid": os.getpid(),
        }

    def close(self) -> None:
        self.spot.wait()
        self.receiver.stop()
