"""What the engine takes and returns: requests, sampling parameters, outputs, and per-step records.

``GenerationRequest`` -> ``Engine.generate`` -> ``RequestOutput`` (``engine.py``); ``StepRecord`` is one decode
step of ``Engine.step_log``; ``RunningRequest`` is the engine's state of a request that holds a KV-cache slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings (need a tokenizer); the stop string stays in the text
    seed: int | None = None


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    problem_id: str = ""  # responses to the same prompt share it (suffix-tree history, length classes)
    # trace replay: emit exactly these token ids, then EOS (engine.py docstring); None = sample from the policy
    reference: list[int] | None = None


@dataclass
class RequestTimings:
    """Seconds since the ``generate`` call started (or the engine's clock origin)."""

    arrival_s: float = 0.0
    first_token_s: float = 0.0
    finish_s: float = 0.0
    decode_steps: int = 0  # verify steps this request took part in


@dataclass
class SpecCounters:
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0  # steps with a non-empty draft
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count per draft depth
    drafted_by_position: list[int] = field(default_factory=list)
    drafter_counts: dict[str, list[int]] = field(default_factory=dict)  # name -> [drafted, accepted]
    # name -> {acceptance length (accepted + 1): verify steps}
    tau_counts: dict[str, dict[int, int]] = field(default_factory=dict)


@dataclass
class RequestOutput:
    request_id: str
    problem_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    timings: RequestTimings
    spec: SpecCounters
    text: str | None = None


@dataclass
class StepRecord:
    t_start: float  # seconds since clock origin
    seconds: float
    batch_size: int
    strategy: str
    committed: int
    drafted: int
    accepted: int
    draft_seconds: float
    capture_seconds: float = 0.0  # part of ``seconds`` spent capturing CUDA graphs (one-off; not observed)
    leased: bool = False  # a plain step played under the selector's ``Lease``: neither chosen nor observed
    # the process's CPU time over ``seconds`` (``Engine(cpu_clock=True)`` only)
    cpu_seconds: float | None = None
    # the target forward's wall time within ``seconds`` (on CUDA the host's launch: kernels run asynchronously)
    forward_seconds: float = 0.0


@dataclass
class RunningRequest:
    """A request holding a KV-cache slot: its generator, coupled uniforms, output so far and counters."""

    req: GenerationRequest
    slot: int
    gen: torch.Generator
    u_pos: torch.Tensor  # [max_new_tokens + 1] uniform of each output position (coupled sampling)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    root: int = -1  # last sampled token, not yet in the KV cache
    hidden: torch.Tensor | None = None  # target hidden state(s) of the position that produced ``root``
    to_sink: bool = False  # its committed positions' hidden states go to the engine's ``hidden_sink``
    timings: RequestTimings = field(default_factory=RequestTimings)
    spec: SpecCounters = field(default_factory=SpecCounters)
    finish_reason: str | None = None
