"""What the driver sends a rollout actor and gets back: ``RolloutRequest`` and ``ShardResult`` (plain,
picklable data), and which requests stream their hidden states to the spot trainer (``streams_hidden``)."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

from services.rollout_actor.requests import RequestOutput, StepRecord


def streams_hidden(request_id: str, fraction: float) -> bool:
    """Whether request ``request_id``'s hidden states go to the spot trainer when a ``fraction`` (0..1] of
    requests is streamed: a hash of the id, so the choice is the same on every worker and every run."""
    return zlib.crc32(request_id.encode()) % 10_000 < fraction * 10_000


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
    choices: dict | None = None  # tuner arm -> decode steps it was chosen for (None without a tuner)
    # bucket label ('8-15') -> tuner arm -> decode steps, from the observations reported to the tuner
    choices_by_bucket: dict | None = None
    observations_reported: int = 0  # records sent to the tuner after this shard (leased steps ride on them)

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = ["RolloutRequest", "ShardResult", "streams_hidden"]
