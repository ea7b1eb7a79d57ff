"""PolicyTrainerService (services/policy_trainer/actor.py): the update's torch thread count."""

import os
from dataclasses import asdict

import torch

from services.common.config import TrainerConfig
from services.policy_trainer.actor import PolicyTrainerService, update_threads
from tests.policy_trainer.test_trainer import tiny_model


def test_update_threads_zero_means_every_usable_core():
    assert update_threads(0) == len(os.sched_getaffinity(0))
    assert update_threads(3) == 3


def test_train_step_runs_with_the_configured_threads_and_restores_the_process_count(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    svc = PolicyTrainerService(str(tmp_path), asdict(TrainerConfig(threads=3, micro_batch_size=2)), seed=0)
    seen = []
    real = svc.trainer.train_step

    def recording(samples):
        seen.append(torch.get_num_threads())
        return real(samples)

    svc.trainer.train_step = recording
    before = torch.get_num_threads()
    sample = dict(prompt_ids=[1, 2, 3], response_ids=[4, 5], advantage=0.5)
    stats = svc.train_step([sample, dict(sample, advantage=-0.5)])
    assert seen == [3]
    assert stats["version"] == 1
    assert torch.get_num_threads() == before  # rollout workers may share this process (no Ray)
