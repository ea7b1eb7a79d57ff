"""PolicyTrainerService: the policy-trainer actor (a thin shell around ``PolicyTrainer``; no logic of its own)."""

from __future__ import annotations

import torch

from services.common.config import TrainerConfig
from services.policy_trainer.trainer import PolicyTrainer, RolloutSample
from services.rollout_actor.model import Transformer


class PolicyTrainerService:
    """Loads the initial policy from ``model_path`` and trains it with ``TrainerConfig(**trainer_cfg)``."""

    def __init__(self, model_path: str, trainer_cfg: dict, seed: int = 0, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.trainer = PolicyTrainer(
            Transformer.from_pretrained(model_path), TrainerConfig(**trainer_cfg), seed=seed
        )

    def ping(self) -> int:
        return self.trainer.version

    def train_step(self, samples: list[dict]) -> dict:
        return self.trainer.train_step([RolloutSample(**s) for s in samples])

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.policy_state_dict()

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)
