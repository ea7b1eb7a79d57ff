"""RolloutWorker: one rollout actor's state, plain Python (the Ray actor in ``actor.py`` only wraps it).

It owns a copy of the policy (``Transformer``), the tokenizer and a decoding ``Engine``; it decodes the shard
of requests the driver assigns it and returns finished responses with per-request timings and the worker's
own start/finish times (the driver derives the long tail and the bubbles from them). New policy weights
arrive versioned (``load_weights``) between rollout phases, never during one.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import torch

from services.rollout_actor.engine import Engine, GenerationRequest, RequestOutput, SamplingParams, StepRecord
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.strategy import FixedPolicy, Strategy, StrategyPolicy


@dataclass
class RolloutRequest:
    """A request as the driver sends it (plain data, picklable)."""

    request_id: str
    problem_id: str
    prompt_ids: list[int]
    seed: int


@dataclass
class ShardResult:
    worker: int
    policy_version: int
    started_at: float  # wall clock (time.time()) when decoding started
    finished_at: float  # wall clock when the worker's last request finished
    outputs: list[RequestOutput]
    steps: list[StepRecord]

    def to_dict(self) -> dict:
        return asdict(self)


class RolloutWorker:
    """Decodes shards of requests with one engine.

    Args:
        worker_id: index of this worker in the pool.
        model_path: HF folder of the initial policy.
        sampling: temperature / top_p / top_k / max_new_tokens used for every request.
        max_batch_size: KV slots.
        threads: torch intra-op threads for this worker.
        policy: speculation strategy policy (default off).
        drafters: name -> Drafter.
    """

    def __init__(
        self,
        worker_id: int,
        model_path: str,
        sampling: dict,
        max_batch_size: int = 64,
        threads: int = 1,
        policy: StrategyPolicy | None = None,
        drafters: dict | None = None,
        max_seq_len: int | None = None,
    ):
        torch.set_num_threads(max(1, threads))
        from tokenizers import Tokenizer

        self.worker_id = worker_id
        self.model = Transformer.from_pretrained(model_path)
        self.tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
        self.sampling = dict(sampling)
        self.policy_version = 0
        seq = max_seq_len or min(self.model.config.max_position_embeddings, 1024)
        self.engine = Engine(
            self.model,
            max_batch_size=max_batch_size,
            max_seq_len=seq,
            tokenizer=self.tokenizer,
            drafters=drafters,
            policy=policy or FixedPolicy(),
        )

    def set_strategy(self, strategy: Strategy) -> None:
        self.engine.policy = FixedPolicy(strategy)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Install new policy weights (between rollout phases). Returns the installed version."""
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise ValueError(
                f"worker {self.worker_id}: weight mismatch missing={missing[:3]} unexpected={unexpected[:3]}"
            )
        self.policy_version = version
        return version

    def rollout(self, requests: list[RolloutRequest]) -> ShardResult:
        """Decode every request to completion (continuous batching)."""
        p = self.sampling
        reqs = [
            GenerationRequest(
                r.request_id,
                r.prompt_ids,
                SamplingParams(
                    temperature=p["temperature"],
                    top_p=p["top_p"],
                    top_k=p["top_k"],
                    max_new_tokens=p["max_new_tokens"],
                    seed=r.seed,
                ),
                r.problem_id,
            )
            for r in requests
        ]
        self.engine.step_log = []
        started = time.time()
        outs = self.engine.generate(reqs) if reqs else []
        finished = time.time()
        return ShardResult(
            self.worker_id, self.policy_version, started, finished, outs, list(self.engine.step_log)
        )

    def ping(self) -> int:
        return self.worker_id
