"""PolicyTrainerService: the policy-trainer actor (a thin shell around ``PolicyTrainer``; no logic of its own)."""

from __future__ import annotations

import os

import torch

from services.common.config import TrainerConfig
from services.policy_trainer.trainer import PolicyTrainer, RolloutSample
from services.rollout_actor.model import Transformer


def update_threads(threads: int) -> int:
    """Torch threads for the policy update: ``threads`` if > 0, else every core this process may use
    (``os.sched_getaffinity``; Ray's default for an actor without CPUs is 1 thread)."""
    if threads > 0:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class PolicyTrainerService:
    """Loads the initial policy from ``model_path`` and trains it with ``TrainerConfig(**trainer_cfg)``; each
    ``train_step`` runs with ``update_threads(trainer_cfg["threads"])`` torch threads and restores the
    process's count afterwards (without Ray the rollout workers share this process)."""

    def __init__(self, model_path: str, trainer_cfg: dict, seed: int = 0):
        self.threads = update_threads(int(trainer_cfg.get("threads", 0)))
        torch.manual_seed(seed)
        self.trainer = PolicyTrainer(
            Transformer.from_pretrained(model_path), TrainerConfig(**trainer_cfg), seed=seed
        )

    def ping(self) -> int:
        return self.trainer.version

    def pid(self) -> int:
        """This actor's process id (fault tests kill it)."""
        return os.getpid()

    def train_step(self, samples: list[dict]) -> dict:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self.trainer.train_step([RolloutSample(**s) for s in samples])
        finally:
            torch.set_num_threads(before)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.policy_state_dict()

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)

    def save_state(self, path: str) -> None:
        self.trainer.save_state(path)

    def load_state(self, path: str) -> int:
        """Continue from a ``save_state`` folder; returns the restored policy version."""
        self.trainer.load_state(path)
        return self.trainer.version
