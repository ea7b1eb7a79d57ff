"""The long-tail benchmark's workload: configuration names, GSM8K prompts x G requests per batch size, the
run config's sampling, and the production gate on the learned drafter.

One workload per batch size b, the same for every configuration: ``P`` GSM8K *test* prompts (a seeded
sample, ``format_prompt``) x ``G`` responses each (a GRPO group shares a ``problem_id``). ``P`` defaults to
``max(2, ceil(2 b / G))`` (at least two groups and 2 b requests, so the batch fills, drains and the long tail
shows). The adaptive warm-up uses as many *other* test prompts; the suffix drafter's history, train prompts.
Every configuration and repetition uses the same request seeds, so tailspec's lossless configurations decode
the same tokens and repetitions repeat the same work.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from services.rollout_actor.engine import GenerationRequest, SamplingParams
from services.rollout_actor.speculative.strategy import Strategy

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "services" / "pipeline" / "assets" / "base_policy"
DEFAULT_CONFIG = REPO / "configs" / "gsm8k_tiny.yaml"

FIXED_ARMS: dict[str, Strategy] = {
    "suffix-k4": Strategy("suffix", 4),
    "suffix-k8": Strategy("suffix", 8),
    "suffix-k12": Strategy("suffix", 12),
    "suffix-tree-k16w2d8": Strategy("suffix", 16, 2, 8),
    "ngram-k3": Strategy("ngram", 3),
    "ngram-k5": Strategy("ngram", 5),
}
QUICK_ARMS = ("suffix-k8", "ngram-k3")  # --quick: one arm per deterministic drafter
LEARNED_ARMS: dict[str, Strategy] = {"learned-k4": Strategy("learned", 4)}
VLLM_CONFIGS: dict[str, tuple[str, int]] = {
    "vllm-plain": ("none", 0),
    "vllm-ngram-k5": ("ngram", 5),
    "vllm-suffix-k8": ("suffix", 8),
}
# Length-matched vLLM runs: the same runner process, every request forced to generate exactly the length
# tailspec plain produced for it (min_tokens = max_tokens): the same amount of work, token for token.
MATCHED = "-matched"
VLLM_MATCHED: dict[str, str] = {f"{c}{MATCHED}": c for c in VLLM_CONFIGS}
PLAIN, ADAPTIVE, ADAPTIVE_COLD = "plain", "adaptive", "adaptive-cold"
PLAIN_AGAIN = "plain-again"  # lock-step A/A control: a second plain engine
HF_PLAIN, HF_PLD = "hf-plain", "hf-pld"
LONGTAIL_BATCH = 8  # a decode step with at most this many active requests is in the long-tail phase
SPOT_META = "tailspec_spot.json"  # in an exported drafter folder: {"version", "top1"} (spot_training_effect)


def sampling_of(config_path: Path = DEFAULT_CONFIG) -> dict:
    """rollout.{temperature, top_p, top_k, max_new_tokens} of the run config."""
    from services.common.config import load_config

    r = load_config(config_path).rollout
    return {
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "max_new_tokens": r.max_new_tokens,
    }


@dataclass
class Prompt:
    problem_id: str
    ids: list[int]


@dataclass
class Workload:
    batch_size: int
    prompts: list[Prompt]
    group: int

    @property
    def num_requests(self) -> int:
        return len(self.prompts) * self.group

    def requests(self, sampling: dict, seed_base: int) -> list[GenerationRequest]:
        out = []
        for p_i, p in enumerate(self.prompts):
            for g in range(self.group):
                params = SamplingParams(**sampling, seed=seed_base + p_i * self.group + g)
                out.append(GenerationRequest(f"{p.problem_id}-g{g}", list(p.ids), params, p.problem_id))
        return out


@dataclass
class Workloads:
    """Per batch size: the measured workload and the adaptive warm-up's (disjoint prompts); the history."""

    measured: dict[int, Workload]
    warm: dict[int, Workload]
    history: Workload
    test_indices: list[int]
    warm_indices: list[int]


def build_workloads(
    tokenizer,
    batch_sizes: list[int],
    group: int,
    prompts: int | None,
    prompt_scale: int,
    history_prompts: int,
    seed: int,
    quick: bool,
) -> Workloads:
    """GSM8K prompts per batch size (``prompts`` fixes P for every b; ``quick``: at most 2)."""
    from services.pipeline.datasets import default_dataset_dir, format_prompt, load_gsm8k

    data = default_dataset_dir()
    test, train = load_gsm8k(data / "test.jsonl"), load_gsm8k(data / "train.jsonl")

    def n_prompts(b: int) -> int:
        if prompts:
            return prompts
        p = max(2, math.ceil(2 * b / group)) * prompt_scale
        return min(p, 2) if quick else p

    def enc(rows, i: int, tag: str) -> Prompt:
        return Prompt(f"{tag}-{i}", tokenizer.encode(format_prompt(rows[i].question)).ids)

    rng = random.Random(seed)
    max_p = max(n_prompts(b) for b in batch_sizes)
    picked = rng.sample(range(len(test)), 2 * max_p)
    order, warm_order = picked[:max_p], picked[max_p:]
    measured = [enc(test, i, "test") for i in order]
    warm = [enc(test, i, "test") for i in warm_order]
    hist = [enc(train, i, "train") for i in rng.sample(range(len(train)), history_prompts)]
    return Workloads(
        measured={b: Workload(b, measured[: n_prompts(b)], group) for b in batch_sizes},
        warm={b: Workload(b, warm[: n_prompts(b)], group) for b in batch_sizes},
        history=Workload(max(batch_sizes), hist, group),
        test_indices=order,
        warm_indices=warm_order,
    )


def learned_gate(learned: Path | None, min_top1: float) -> dict:
    """The production gate on the learned drafter (``tuner.learned_min_top1``; ``make run`` applies it in
    ``ControlPlane.gated_drafters``), for the adaptive policy here: its arms stay out of the table unless the
    head's spot-trainer top-1 (``SPOT_META`` in the checkpoint folder) reaches ``min_top1``; an unknown top-1
    gates them as an untrained head does there. 0 = never gated. The fixed ``learned-k4`` arm is measured
    either way. Returns ``{min_top1, top1, gated}``. Raises SystemExit when ``SPOT_META`` is unreadable."""
    top1 = None
    meta = learned / SPOT_META if learned is not None else None
    if meta is not None and meta.is_file():
        try:
            top1 = json.loads(meta.read_text()).get("top1")
            top1 = None if top1 is None else float(top1)
        except (ValueError, TypeError, AttributeError) as e:
            raise SystemExit(f"{meta}: not a JSON object with a numeric 'top1' ({e})") from None
    gated = learned is not None and min_top1 > 0 and (top1 is None or top1 < min_top1)
    return {"min_top1": min_top1, "top1": top1, "gated": gated}
